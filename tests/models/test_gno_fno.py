"""The GNO on neuraloperator's FNO (`gno_fno`): tested like the GNO (routing by theta, only the
selected kernel runs, sensitivity to boundary data on the affected face, batch independence,
a tiny overfit), plus a forward and backward pass that read nothing on the host."""

import pytest
import torch

pytest.importorskip("neuralop")

from gno_ext.layers import balance_losses  # noqa: E402
from gno_ext.layers.spectral import GatedSpectralConv  # noqa: E402
from gno_ext.models import available_models, from_checkpoint, get_model, save_checkpoint  # noqa: E402
from gno_ext.models.gno_fno import BoundaryLayer  # noqa: E402
from gno_ext.schema import BoundarySpec  # noqa: E402
from tests.models._overfit import overfit_loss_ratio  # noqa: E402


def tiny(**kw):
    args = dict(n_modes=6, hidden_channels=16, n_layers=2, n_kernels=3, gate_hidden=8, boundary_patch=8,
                boundary_depth=3)
    args.update(kw)
    return get_model("gno_fno", **args)


def bc_mixed(batch, values=(1.0, -2.0, 0.0, 0.5)):
    return BoundarySpec.from_types(["dirichlet", "neumann", "dirichlet", "neumann"], list(values), batch_size=batch)


def convs(model):
    return [m for m in model.modules() if isinstance(m, GatedSpectralConv)]


@pytest.mark.parametrize("ndim,shape", [(1, (32,)), (2, (32, 32)), (2, (16, 48)), (3, (16, 8, 16))])
def test_shapes_in_1d_2d_and_3d(ndim, shape):
    torch.manual_seed(0)
    model = tiny(ndim=ndim, in_channels=2, n_params=2, field_channels=ndim, n_modes=4)
    b = 3
    y = model(torch.randn(b, 1, 2, *shape), theta=torch.rand(b, 2), theta_field=torch.randn(b, ndim, *shape),
              bc=BoundarySpec.from_types(["dirichlet", "neumann"] * ndim, 1.0, batch_size=b))
    assert y.shape == (b, 1, 2, *shape)


def test_registry_and_ablations():
    assert "gno_fno" in available_models()
    full, single, plain = tiny(), tiny(n_kernels=1), tiny(boundary_transfer=False)
    assert [len(c.kernels) for c in convs(single)] == [1, 1] and single.boundary is not None
    assert plain.boundary is None and len(convs(plain)[0].kernels) == 3
    assert sum(p.numel() for p in single.parameters()) < sum(p.numel() for p in full.parameters())
    with pytest.raises(ValueError, match="n_kernels=3: the gate needs parameters"):
        tiny(n_params=0)
    with pytest.raises(ValueError, match="boundary_depth: must be an integer >= 1, got 0"):
        tiny(boundary_depth=0)
    with pytest.raises(ValueError, match=r"grid \(36, 36\): every axis must be divisible by boundary_patch=8"):
        tiny()(torch.randn(1, 1, 1, 36, 36), theta=torch.rand(1, 1))


def test_without_parameter_channels_the_parameters_act_through_the_gates_alone():
    """``parameter_channels=False`` drops the parameter and field-parameter input channels: with
    one kernel and no boundary operator the output then ignores them; with several kernels they
    act only through the gates. With the channels (default) they change the output in every
    case."""
    torch.manual_seed(4)
    b, shape = 4, (16, 16)
    u = torch.randn(b, 1, 1, *shape)
    field = torch.randn(b, 2, *shape)
    theta, other = torch.rand(b, 1), torch.rand(b, 1)
    lone = tiny(n_kernels=1, boundary_transfer=False, field_channels=2, parameter_channels=False).eval()
    seen = tiny(n_kernels=1, boundary_transfer=False, field_channels=2).eval()
    # the lifting reads 1 + 2 fewer channels (the parameter and the two field channels)
    assert lone.net.lifting.fcs[0].in_channels == seen.net.lifting.fcs[0].in_channels - 3
    with torch.no_grad():
        torch.testing.assert_close(lone(u, theta=theta, theta_field=field),
                                   lone(u, theta=other, theta_field=field * 3))
        assert not torch.allclose(seen(u, theta=theta, theta_field=field), seen(u, theta=other, theta_field=field))
    gated = tiny(boundary_transfer=False, parameter_channels=False).eval()  # the gates still read them
    spread = torch.linspace(-3, 3, b)[:, None]
    with torch.no_grad():
        first = gated(u, theta=spread)
        routes = [c.last_routing.index.clone() for c in convs(gated)]
        second = gated(u, theta=spread.flip(0))
    assert any(not torch.equal(c.last_routing.index, r) for c, r in zip(convs(gated), routes))
    assert not torch.allclose(first, second)


def test_every_parameter_gets_a_gradient_and_unselected_kernels_none():
    torch.manual_seed(2)
    model = tiny(field_channels=2)
    b = 8
    with balance_losses() as balance:
        y = model(torch.randn(b, 1, 1, 32, 32), theta=torch.linspace(-3, 3, b)[:, None],
                  theta_field=torch.randn(b, 2, 32, 32), bc=bc_mixed(b))
    assert len(balance) == len(convs(model))  # one gate per Fourier layer
    (y.pow(2).mean() + 0.01 * torch.stack(balance).sum()).backward()
    kernel_params = set()
    for conv in convs(model):
        used = set(conv.last_routing.index.tolist())
        for k, kernel in enumerate(conv.kernels):
            for p in kernel.parameters():
                kernel_params.add(id(p))
                assert bool(p.grad.abs().sum() > 0) == (k in used), (k, used)
    assert any(len(set(c.last_routing.index.tolist())) < 3 for c in convs(model))  # an unused kernel to check
    missing = [n for n, p in model.named_parameters() if id(p) not in kernel_params and (p.grad is None or not p.grad.any())]
    assert missing == []


@pytest.mark.parametrize("soft", [False, True])
def test_batch_independence(soft):
    torch.manual_seed(3)
    model = tiny(soft_routing=soft).eval()
    u, theta, bc = torch.randn(4, 1, 1, 32, 32), torch.rand(4, 1), bc_mixed(4)
    y = model(u, theta=theta, bc=bc)
    u2, theta2 = u.clone(), theta.clone()
    u2[1:], theta2[1:] = torch.randn(3, 1, 1, 32, 32), torch.rand(3, 1)
    assert torch.allclose(y[0], model(u2, theta=theta2, bc=bc)[0], atol=1e-5)


def test_different_parameters_route_to_different_kernels_and_change_the_output():
    torch.manual_seed(4)
    model = tiny(n_kernels=4, log_params=[True]).eval()
    model.param_norm.fit(torch.logspace(-2, 0, 50)[:, None])
    theta = torch.logspace(-2, 0, 64)[:, None]
    with torch.no_grad():  # each gate's scores rise with theta at different rates: several kernels in use
        for conv in convs(model):
            first, last = conv.gate.score[0], conv.gate.score[2]
            first.weight.fill_(1.0), first.bias.fill_(2.0)
            last.weight.copy_(torch.arange(4.0)[:, None].expand_as(last.weight) / last.weight.shape[1])
            last.bias.copy_(torch.tensor([1.5, 1.0, 0.5, 0.0]))
    u = torch.randn(1, 1, 1, 32, 32).expand(64, -1, -1, -1, -1)
    y = model(u, theta=theta, bc=BoundarySpec.periodic(2, 64))
    for index in model.routing_index():
        assert index.tolist() == sorted(index.tolist()) and len(set(index.tolist())) > 1  # by theta, in order
    assert (y[0] - y[-1]).abs().max() > 1e-4
    # the routing depends on theta alone: the same theta, another field, the same kernels
    before = [i.clone() for i in model.routing_index()]
    model(torch.randn(64, 1, 1, 32, 32), theta=theta, bc=BoundarySpec.periodic(2, 64))
    assert all(torch.equal(a, b) for a, b in zip(before, model.routing_index()))


def test_changing_only_boundary_data_changes_the_output_near_that_boundary():
    torch.manual_seed(5)
    model = tiny(n_layers=1).eval()
    u, theta = torch.randn(1, 1, 1, 32, 32), torch.rand(1, 1)
    base = model(u, theta=theta, bc=bc_mixed(1, (1.0, 0.0, 0.0, 0.0)))
    moved = model(u, theta=theta, bc=bc_mixed(1, (5.0, 0.0, 0.0, 0.0)))  # only the x- Dirichlet value
    change = (moved - base).abs()[0, 0, 0]  # (x, y)
    assert change[:3].mean() > 1e-4
    assert change[:3].mean() > 3 * change[-3:].mean()  # most at the face whose data changed
    ablated = tiny(boundary_transfer=False).eval()
    a = ablated(u, theta=theta, bc=bc_mixed(1, (1.0, 0.0, 0.0, 0.0)))
    assert torch.equal(a, ablated(u, theta=theta, bc=bc_mixed(1, (5.0, 0.0, 0.0, 0.0))))


def test_domain_padding_keeps_the_grid_and_the_boundary_at_its_face():
    """With domain padding the Fourier layers see a larger, zero-padded field, the output has the
    input's grid, and boundary data still act at the physical face they belong to."""
    torch.manual_seed(5)
    padded = tiny(n_layers=1, domain_padding=0.25).eval()
    torch.manual_seed(5)
    plain = tiny(n_layers=1).eval()  # the same weights: padding has none of its own
    assert all(torch.equal(a, b) for a, b in zip(padded.parameters(), plain.parameters()))
    u, theta = torch.randn(1, 1, 1, 32, 32), torch.rand(1, 1)
    base = padded(u, theta=theta, bc=bc_mixed(1, (1.0, 0.0, 0.0, 0.0)))
    assert base.shape == u.shape
    assert (base - plain(u, theta=theta, bc=bc_mixed(1, (1.0, 0.0, 0.0, 0.0)))).abs().max() > 1e-4
    moved = padded(u, theta=theta, bc=bc_mixed(1, (5.0, 0.0, 0.0, 0.0)))  # only the x- Dirichlet value
    change = (moved - base).abs()[0, 0, 0]
    assert change[:3].mean() > 3 * change[-3:].mean()
    # the Fourier layers run on 32 + 2 * 8 cells per axis,
    # and the boundary layer is written on the 32 x 32 physical cells inside the padding
    seen = []
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[2:]))
             for m in (padded.boundary[0], padded.net.fno_blocks)]
    padded(u, theta=theta, bc=bc_mixed(1))
    for hook in hooks:
        hook.remove()
    assert seen == [(32, 32), (48, 48)]
    for bad in (-0.1, 1.0, True, "0.1"):
        with pytest.raises(ValueError, match="domain_padding: must be a fraction in"):
            tiny(domain_padding=bad)


def test_the_boundary_layer_writes_each_segment_into_its_own_cells():
    """A segment's vector lands on the cells of its segment of its face, weighted by the depth
    profile, and nowhere else."""
    torch.manual_seed(6)
    layer = BoundaryLayer(channels=4, ndim=2, patch=4, depth=2)
    h = torch.randn(1, 4, 8, 12)
    tokens = torch.zeros(1, 2 * 3 + 2 * 2, 4)  # faces x-, x+ (3 segments along y), y-, y+ (2 along x)
    tokens[0, 1] = 1.0  # face x-, segment 1: y in [4, 8)
    layer.transfer.forward = lambda features, state: tokens
    out = layer(h, None)
    expected = torch.zeros_like(h)
    expected[0, :, 0, 4:8] = layer.profile[0]
    expected[0, :, 1, 4:8] = layer.profile[1]
    torch.testing.assert_close(out, expected)
    assert layer.face_cells(h).shape == (1, 10, 4)
    torch.testing.assert_close(layer.face_cells(h)[0, 1], h[0, :, 0, 4:8].mean(-1))  # the state it reads


def test_without_a_periodic_boundary_layer_periodic_faces_get_none_and_the_others_theirs():
    """``periodic_boundary_layer=False``: the boundary layer is zero at periodic faces (a periodic
    domain gets none at all) and, at the other faces, what the default layer writes there."""
    from gno_ext.layers.boundary import boundary_features
    from gno_ext.schema import Grid

    torch.manual_seed(2)
    grid = Grid((16, 16))
    both = [BoundaryLayer(channels=4, ndim=2, patch=8, depth=2, periodic=p) for p in (True, False)]
    both[1].load_state_dict(both[0].state_dict())
    h = torch.randn(2, 4, 16, 16)
    bc = BoundarySpec.from_types(["dirichlet", "dirichlet", "periodic", "periodic"], [1.0, -1.0, 0.0, 0.0],
                                 batch_size=2)  # x faces Dirichlet, y faces periodic
    default, masked = (layer(h, boundary_features(bc, grid, 8)) for layer in both)
    y_only = torch.zeros(16, 16, dtype=torch.bool)  # cells 2 deep behind a y face, out of the x faces' reach
    y_only[2:-2, :2], y_only[2:-2, -2:] = True, True
    x_only = y_only.T.clone()
    assert default[..., y_only].abs().min() > 0 and torch.count_nonzero(masked[..., y_only]) == 0
    assert masked[..., x_only].abs().min() > 0
    torch.testing.assert_close(masked[..., x_only], default[..., x_only])
    assert torch.count_nonzero(masked[..., 2:-2, 2:-2]) == 0  # the interior, as always
    periodic = boundary_features(BoundarySpec.periodic(2, 2), grid, 8)
    assert torch.count_nonzero(both[1](h, periodic)) == 0 and both[0](h, periodic).abs().sum() > 0
    model = tiny(periodic_boundary_layer=False)
    assert not any(layer.periodic for layer in model.boundary) and "periodic_boundary_layer=False" in repr(model)


@pytest.mark.parametrize("soft", [False, True])
def test_tiny_gno_fno_overfits_a_handful_of_samples(soft):
    torch.manual_seed(6)
    assert overfit_loss_ratio(tiny(hidden_channels=24, soft_routing=soft), steps=200, lr=3e-3) < 0.01


def test_soft_routing_mixes_every_kernel_and_the_output_moves_smoothly_with_theta():
    """``gno_fno_soft``: every kernel of every layer gets a gradient from every batch (no kernel
    left out), and a small change of theta changes the output by a small amount (no jump
    where the hard gate would switch kernels)."""
    torch.manual_seed(8)
    model = tiny(soft_routing=True)
    assert all(c.soft_routing for c in convs(model)) and "soft_routing=True" in repr(model)
    u, bc = torch.randn(1, 1, 1, 32, 32), bc_mixed(1)
    model(u, theta=torch.full((1, 1), 0.3), bc=bc).square().mean().backward()
    assert all(bool(p.grad.abs().sum() > 0) for c in convs(model) for k in c.kernels for p in k.parameters())
    model.eval()
    theta = torch.linspace(-3, 3, 601)[:, None]
    with torch.no_grad():
        y = model(u.expand(601, -1, -1, -1, -1), theta=theta, bc=bc_mixed(601))
        for conv in convs(model):  # the same weights, the hard choice
            conv.soft_routing = False
        z = model(u.expand(601, -1, -1, -1, -1), theta=theta, bc=bc_mixed(601))
    steps = (y[1:] - y[:-1]).flatten(1).abs().amax(1)
    jumps = (z[1:] - z[:-1]).flatten(1).abs().amax(1)
    assert jumps.max() > 20 * steps.max()  # the hard choice switches kernels somewhere in [-3, 3]
    assert steps.max() < 0.05 * (y[-1] - y[0]).abs().max()


def test_forward_and_backward_read_nothing_on_the_host():
    """The training step can be captured in a CUDA graph: on PyTorch's meta device, which holds
    no values, the gated layers and the boundary operator run forward and backward."""
    model = tiny()
    x = torch.empty(4, 16, 32, 32, device="meta", requires_grad=True)
    gate_input = torch.empty(4, 1, device="meta")
    from gno_ext.layers.spectral import condition_on

    net = model.net.to("meta")
    layer = model.boundary[0].to("meta")
    tokens = torch.empty(4, 16, 16, device="meta")
    layer.transfer.forward = lambda features, state: tokens * state.sum()  # the operator itself: tested with the GNO
    with condition_on(net, gate_input):
        h = x + layer(x, None)
        net.fno_blocks(h, 0).sum().backward()
    assert x.grad.shape == x.shape


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(7)
    model = tiny(n_params=2, log_params=[True, False]).eval()
    model.fit_normalization(torch.randn(8, 1, 1, 32, 32) * 3 + 1, torch.rand(8, 2) + 0.1)
    u, theta = torch.randn(2, 1, 1, 32, 32), torch.rand(2, 2) + 0.1
    save_checkpoint(model, tmp_path / "m")
    again = from_checkpoint(tmp_path / "m")
    assert torch.equal(model(u, theta=theta, bc=bc_mixed(2)), again(u, theta=theta, bc=bc_mixed(2)))
