"""The baselines: shapes, gradients, batch independence, a tiny overfit, and each family's own property."""

from __future__ import annotations

import pytest
import torch

from gno_ext.layers import balance_losses
from gno_ext.models import get_model
from gno_ext.models.baselines import ViT
from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch

SMALL = {"latent": 32, "patch": 4, "depth": 2, "heads": 2}
FNO = {"n_modes": 6, "hidden_channels": 16, "n_layers": 2}
CAPE = {"widening": 16, "norm_dim": 32}
BUILDERS = {
    "vit": ("vit", {**SMALL, "t_in": 2}),
    "concat": ("concat", SMALL),
    "cape_unet": ("cape_unet", {"features": 8, "levels": 2, **CAPE}),
    "cape_fno": ("cape_fno", {"n_modes": 6, "hidden_channels": 16, "n_layers": 2, **CAPE}),
    "cape_attn": ("cape_attn", {**SMALL, **CAPE}),
    "unisolver": ("unisolver", SMALL),
    "moe_pot": ("moe_pot", SMALL),
    **{f"{m}-{w}": ("conditioned_vit", {**SMALL, "method": m, "where": w})
       for m in ("film", "pos", "proj", "token") for w in ("encoder", "layers")},
    "pino": ("pino", {**FNO, "equation": "advection"}),
    "fno": ("fno", FNO),
}


NEED_NEURALOP = ("fno", "pino", "cape_fno")  # built on neuraloperator's FNO (the `neuralop` extra)


def build(key: str, seed: int = 0, **extra) -> torch.nn.Module:
    name, kwargs = BUILDERS[key]
    if name in NEED_NEURALOP:
        pytest.importorskip("neuralop")
    torch.manual_seed(seed)
    kwargs = {"in_channels": 1, "n_params": 1, "field_channels": 2, "ndim": 2, "log_params": [True], **kwargs, **extra}
    model = get_model(name, **kwargs)
    model.fit_normalization(torch.randn(8, 1, 1, 16, 16), torch.logspace(-2, 0, 8)[:, None])
    return model


def batch_for(model, b: int = 4, seed: int = 1) -> PDEBatch:
    g = torch.Generator().manual_seed(seed)
    t_in, s = model.t_in, (16, 16)
    kind = torch.tensor([[1, 1, 2, 2]] * b)
    values = torch.randn(b, 4, 2, 1, generator=g)
    return PDEBatch(u_in=torch.randn(b, t_in, 1, *s, generator=g), u_out=torch.randn(b, 1, 1, *s, generator=g),
                    theta=torch.logspace(-2, 0, b)[:, None], bc=BoundarySpec(kind, values), grid=Grid(s),
                    dt=torch.full((b,), 0.01), theta_field=torch.randn(b, 2, *s, generator=g) * 0.5)


def run(model, batch: PDEBatch) -> torch.Tensor:
    return model(batch.u_in, theta=batch.theta, theta_field=batch.theta_field, bc=batch.bc, grid=batch.grid)


@pytest.mark.parametrize("key", BUILDERS)
def test_shape_gradients_and_batch_independence(key):
    model = build(key)
    batch = batch_for(model)
    out = run(model, batch)
    assert out.shape == (4, 1, 1, 16, 16) and torch.isfinite(out).all()
    assert torch.equal(model(batch), out)  # forward(batch) is the same call
    (out - batch.u_out).pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None and ".experts." not in n]
    assert not missing, missing  # MoE experts no token chose are the only parameters without gradient
    assert sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None) > 0
    model.eval()
    with torch.no_grad():
        full = run(model, batch)
        part = run(model, batch[0:2])
    torch.testing.assert_close(part, full[:2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", ["vit", "concat", "cape_unet", "cape_fno", "unisolver", "moe_pot", "film-layers",
                                 "token-encoder", "pino", "fno"])
def test_tiny_overfit(key):
    model = build(key)
    batch = batch_for(model, b=4)
    target = batch.u_in[:, -1:] + 0.3 * torch.sin(batch.u_in[:, -1:])  # a learnable map of the input
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        loss = (run(model, batch) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])


def _changes(model, batch, **replace) -> bool:
    model.eval()
    with torch.no_grad():
        a = run(model, batch)
        b = run(model, PDEBatch(**{**batch.__dict__, **replace}))
    return not torch.allclose(a, b, atol=1e-6)


def _other_bc(batch):
    return BoundarySpec(batch.bc.kind, batch.bc.values + 3.0)


@pytest.mark.parametrize("key", ["cape_unet", "cape_fno", "cape_attn"])
def test_cape_output_depends_on_theta_only(key):
    model = build(key)
    batch = batch_for(model)
    assert _changes(model, batch, theta=batch.theta * 3)
    assert not _changes(model, batch, bc=_other_bc(batch))  # CAPE conditions on scalars only


def test_concat_uses_theta_and_fields_not_boundary():
    model = build("concat")
    batch = batch_for(model)
    assert _changes(model, batch, theta=batch.theta * 3)
    assert _changes(model, batch, theta_field=batch.theta_field * 2)
    assert not _changes(model, batch, bc=_other_bc(batch))


@pytest.mark.parametrize("key", [k for k in BUILDERS if k.split("-")[0] in ("film", "pos", "proj", "token")])
def test_conditioning_variants_use_theta_and_boundary(key):
    model = build(key)
    batch = batch_for(model)
    assert _changes(model, batch, theta=batch.theta * 3)
    assert _changes(model, batch, bc=_other_bc(batch))
    assert model.method == key.split("-")[0] and model.where == key.split("-")[1]


def test_unisolver_starts_as_the_unconditioned_backbone():
    uni = build("unisolver")
    vit = build("vit", t_in=1)
    vit.backbone.load_state_dict(uni.backbone.state_dict())
    vit.u_mean.copy_(uni.u_mean)
    vit.u_std.copy_(uni.u_std)
    batch = batch_for(uni)
    uni.eval(), vit.eval()
    with torch.no_grad():
        torch.testing.assert_close(run(uni, batch), run(vit, batch))
    assert not _changes(uni, batch, theta=batch.theta * 3)  # zero gates: no conditioning yet
    assert not _changes(uni, batch, bc=_other_bc(batch))
    with torch.no_grad():  # once the modulation is trained (non-zero), conditions act
        for m in uni.modulations:
            m.weight.normal_(0, 0.05)
    assert _changes(uni, batch, theta=batch.theta * 3)
    assert _changes(uni, batch, bc=_other_bc(batch))
    assert _changes(uni, batch, theta_field=batch.theta_field * 2)  # point-wise condition


def test_moe_pot_routes_by_latent_state_with_a_positive_balance_loss():
    model = build("moe_pot")
    batch = batch_for(model)
    model.eval()
    with balance_losses() as terms:
        run(model, batch)
    first = model.backbone.blocks[0].mlp.last_index.clone()
    assert first.shape == (4, 16, 2) and (first[..., 0] != first[..., 1]).all()  # two distinct experts per token
    assert len(terms) == len(model.backbone.blocks)  # one router per block
    loss = torch.stack(terms).sum().detach()
    assert torch.isfinite(loss) and loss > 0
    assert not _changes(model, batch, theta=batch.theta * 3)  # routing ignores theta
    run(model, PDEBatch(**{**batch.__dict__, "u_in": batch.u_in * 5 + 1}))
    assert not torch.equal(model.backbone.blocks[0].mlp.last_index, first)  # the state decides
    # one-sided routing drives the balance loss up: its minimum (1) is for uniform use
    assert float(loss) >= 1.0 - 1e-5


def test_moe_pot_dispatches_compute_the_same_function():
    """The dense dispatch (every expert on every token, zero weight where not chosen) gives the
    sparse dispatch's output, balance loss and gradients; an expert that no token chose gets a
    zero gradient instead of none, so only the sparse model needs DDP's unused-parameter search."""
    from gno_ext.layers.mixture import has_dispatch

    dense, sparse = build("moe_pot"), build("moe_pot", dispatch="sparse")
    sparse.load_state_dict(dense.state_dict())
    assert not has_dispatch(dense) and has_dispatch(sparse)
    batch = batch_for(dense)
    outs, losses = [], []
    for model in (dense, sparse):
        with balance_losses() as terms:
            out = run(model, batch)
        (out.square().mean() + torch.stack(terms).sum()).backward()
        outs.append(out.detach())
        losses.append(torch.stack(terms).detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses[0], losses[1])
    assert torch.equal(dense.backbone.blocks[0].mlp.last_index, sparse.backbone.blocks[0].mlp.last_index)
    for (name, p_dense), p_sparse in zip(dense.named_parameters(), sparse.parameters()):
        if p_sparse.grad is None:  # no token chose this expert
            assert p_dense.grad is not None and not p_dense.grad.any(), name
        else:
            torch.testing.assert_close(p_dense.grad, p_sparse.grad, rtol=1e-4, atol=1e-6, msg=name)
    # the model's routing is exercised: some expert of some block took part in the step
    assert any(p.grad is not None and p.grad.any() for n, p in sparse.named_parameters() if ".experts." in n)
    with pytest.raises(ValueError, match="dispatch: expected 'dense' or 'sparse'"):
        build("moe_pot", dispatch="gather")


def test_vit_k_uses_exactly_k_frames():
    model = build("vit", t_in=5)
    batch = batch_for(model)
    assert batch.u_in.shape[1] == 5
    for k in range(5):  # every one of the k frames matters
        u = batch.u_in.clone()
        u[:, k] += 1.0
        assert _changes(model, batch, u_in=u), k
    assert not _changes(model, batch, theta=batch.theta * 3)
    assert not _changes(model, batch, bc=_other_bc(batch))
    with pytest.raises(ValueError, match=r"u_in: expected shape \(B, 5, 1"):
        run(model, batch[0:2].__class__(**{**batch[0:2].__dict__, "u_in": batch.u_in[:2, :4]}))
    assert isinstance(model, ViT)


def test_fno_sees_the_boundary_data():
    model = build("fno")
    batch = batch_for(model)
    assert _changes(model, batch, bc=_other_bc(batch))
    assert _changes(model, batch, theta=batch.theta * 3)


def test_pino_residual_vanishes_on_the_equation():
    """The heat residual is small for a true heat step and large with the wrong diffusivity;
    the network itself ignores theta."""
    from gno_ext.solvers import solve_heat

    model = build("pino", equation="heat", field_channels=0)
    grid = Grid((32, 32))
    k = 2 * torch.pi * torch.arange(32) / 32
    u0 = (torch.sin(k)[:, None] * torch.cos(k)[None, :])[None, None].double()
    alpha = torch.tensor([0.05])
    dt = 1e-3
    u1 = solve_heat(u0, alpha.double(), BoundarySpec.periodic(2, 1), times=[dt], grid=grid)
    batch = PDEBatch(u_in=u0[:, None].float(), u_out=u1.float(), theta=alpha[:, None], bc=BoundarySpec.periodic(2, 1),
                     grid=grid, dt=torch.tensor([dt]))
    true = model.physics_loss(batch, batch.u_out)
    wrong = model.physics_loss(PDEBatch(**{**batch.__dict__, "theta": alpha[:, None] * 3}), batch.u_out)
    assert float(true) < 1e-3 * float(wrong)
    model32 = build("pino", equation="heat", field_channels=0)
    b = batch_for(model32)
    assert not _changes(model32, PDEBatch(**{**b.__dict__, "theta_field": None}), theta=b.theta * 3)
    with pytest.raises(ValueError, match="equation must be one of"):
        build("pino", equation="burgers")


def test_pino_residual_wraps_each_samples_periodic_axes_and_reads_nothing_on_the_host():
    """In a batch that mixes boundary types, each sample's periodic axes wrap and its other axes
    leave their two boundary layers out of the loss (NaN in the residual), sample by sample;
    the physics loss reads no value on the host, forward or backward, so a training step with
    it can be captured in a CUDA graph."""
    model = build("pino", equation="heat", field_channels=0)
    n = 16
    kind = torch.tensor([[BCType.PERIODIC] * 4, [BCType.PERIODIC] * 2 + [BCType.DIRICHLET] * 2])
    bc = BoundarySpec(kind=kind, values=torch.zeros(2, 4, 1, 1))
    torch.manual_seed(0)
    u = torch.randn(2, 1, 1, n, n)
    batch = PDEBatch(u_in=u, u_out=u, theta=torch.full((2, 1), 0.1), bc=bc, grid=Grid((n, n)),
                     dt=torch.full((2,), 1e-3))
    r = model.residual(batch, torch.randn(2, 1, 1, n, n))
    finite = torch.isfinite(r)
    assert bool(finite[0].all())  # all periodic: every cell
    assert not finite[1, ..., [0, -1]].any() and bool(finite[1, ..., 1:-1].all())  # y's layers out
    loss = model.physics_loss(batch, torch.randn(2, 1, 1, n, n))
    assert torch.isfinite(loss) and float(loss) > 0
    from tests._dispatch import HostTensors, RecordOps

    pred = torch.randn(2, 1, 1, n, n, requires_grad=True)
    with RecordOps() as ops:
        model.physics_loss(batch, pred).backward()
    assert ops.host_reads == 0 and pred.grad.abs().sum() > 0
    # on the meta device (no values) it makes no tensor on the host either (a copy to the GPU)
    from types import SimpleNamespace

    meta = model.to("meta")
    on_meta = SimpleNamespace(u_in=u.to("meta"), theta=batch.theta.to("meta"), dt=batch.dt.to("meta"),
                              grid=batch.grid, bc=SimpleNamespace(kind=kind.to("meta")))
    pred = torch.empty(2, 1, 1, n, n, device="meta", requires_grad=True)
    with RecordOps() as ops, HostTensors() as made:
        meta.physics_loss(on_meta, pred).backward()
    assert ops.host_reads == 0 and made.ops == [] and pred.grad.shape == pred.shape


# graph breaks, documented in docs/recipes: neuraloperator's tensorly/opt_einsum contraction
# inside the spectral convolutions (moe_pot's sparse dispatch breaks it too; its default, dense,
# does not)
BREAKS = {"fno", "pino", "cape_fno"}
ONE_GRAPH = [key for key in BUILDERS if key not in BREAKS]


@pytest.mark.parametrize("key", ONE_GRAPH)
def test_compiles_into_one_graph(key):
    """`torch.compile(fullgraph=True)` traces the whole forward pass (no graph break) and gives
    the eager output."""
    model = build(key).eval()
    batch = batch_for(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    assert torch.allclose(run(compiled, batch), run(model, batch), atol=1e-5)


def test_cape_module_makes_no_host_tensor_on_another_device():
    """The CAPE module runs on a device without making tensors on the host: a host tensor copied
    to the GPU inside the step makes the step impossible to capture in a CUDA graph. On the meta
    device, any intermediate tensor that lands on the CPU is such a copy. (The old low-pass
    branch built its frequencies on the CPU and moved them, and failed this test.)"""
    from gno_ext.models.baselines.cape import CAPE
    from tests._dispatch import HostTensors

    for ndim in (1, 2, 3):
        module = CAPE(in_channels=1, n_params=2, ndim=ndim, widening=8, norm_dim=16, modes=3).to("meta")
        x = torch.empty(2, 1, *[12] * ndim, device="meta", requires_grad=True)
        with HostTensors() as mode:
            module(x, torch.empty(2, 2, device="meta")).sum().backward()
        assert mode.ops == [], f"{ndim}-D: host tensors made by {sorted(set(mode.ops))}"
