"""The GNO on irregular domains (`gno_mesh`): tested like the grid GNO — node-order equivariance,
batch independence, routing by theta (only the selected kernels run), sensitivity to boundary
data, a tiny overfit — on samples of an annulus."""

import pytest
import torch

pytest.importorskip("torch_geometric")

from gno_ext.mesh import MeshSample, collate_meshes, radius_edges  # noqa: E402
from gno_ext.models import from_checkpoint, get_model, save_checkpoint  # noqa: E402
from tests.models._overfit import mesh_loss_ratio  # noqa: E402
from tests.test_mesh import disk_with_hole  # noqa: E402


def sample(seed=0, theta=0.1, **kw):
    values = disk_with_hole(seed=seed, **kw)
    values.update(theta=torch.tensor([theta]), edge_index=radius_edges(values["pos"], 0.45))
    return MeshSample(**values)


def tiny(**kw):
    args = dict(n_params=1, field_channels=2, log_params=[True], latent=16, depth=2, heads=2, n_kernels=3,
                gate_hidden=8)
    args.update(kw)
    torch.manual_seed(0)
    model = get_model("gno_mesh", **args)
    model.param_norm.fit(torch.logspace(-2, 0, 16)[:, None])
    return model


def permuted(s: MeshSample, perm: torch.Tensor) -> MeshSample:
    """The same sample with its nodes in the order ``perm`` (new node i is old node perm[i])."""
    new_id = torch.argsort(perm)
    return MeshSample(pos=s.pos[perm], u_in=s.u_in[perm], u_out=s.u_out[perm], theta=s.theta,
                      theta_field=s.theta_field[perm], boundary_index=new_id[s.boundary_index],
                      boundary_kind=s.boundary_kind, boundary_values=s.boundary_values,
                      boundary_normal=s.boundary_normal, boundary_segment=s.boundary_segment,
                      edge_index=new_id[s.edge_index])


OPTIONS = dict(soft_routing=True, relative_positions=True, local=True, boundary_nodes=True)


@pytest.mark.parametrize("kwargs", [dict(kernel="attention"), dict(kernel="integral"), OPTIONS,
                                    dict(OPTIONS, kernel="integral")], ids=["attention", "integral", "options",
                                                                            "integral-options"])
def test_shape_node_order_and_batch_independence(kwargs):
    model = tiny(**kwargs)
    a, b = sample(1, theta=0.05), sample(2, theta=0.8, n_outer=8, n_inner=4, n_inside=9)
    y = model(collate_meshes([a, b]))
    assert y.shape == (a.n_nodes + b.n_nodes, 1, 1) and torch.isfinite(y).all()
    torch.testing.assert_close(model(collate_meshes([a])), y[:a.n_nodes], rtol=1e-5, atol=1e-5)
    perm = torch.randperm(a.n_nodes)
    torch.testing.assert_close(model(collate_meshes([permuted(a, perm)])), y[:a.n_nodes][perm], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(kernel="attention"), dict(kernel="integral"), OPTIONS,
                                    dict(OPTIONS, kernel="integral")], ids=["attention", "integral", "options",
                                                                            "integral-options"])
def test_it_trains_under_bf16_autocast(kwargs):
    """The recipes train in bf16 autocast on a GPU; CPU autocast gives the same mixed types
    (a bf16 projection added into the float32 state failed there once)."""
    model = tiny(**kwargs)
    batch = collate_meshes([sample(1, theta=0.05), sample(2, theta=0.8)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(batch)
    loss = (y.float() - batch.u_out[:, :1]).pow(2).mean()
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads if g is not None)
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) > len(grads) // 2
    # on a GPU, autocast keeps layer norms in float32, so the state between the blocks is float32
    # where on a CPU it is bf16: a block given a float32 state under autocast, as on a GPU
    h = model.lift(model.node_inputs(batch)).detach().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.blocks[0](h, model.gate_input(batch), batch, model.u_std.mean())
    assert out.shape == h.shape and torch.isfinite(out).all()


def test_graphs_are_routed_by_theta_and_only_their_kernels_run():
    model = tiny()
    graphs = [sample(s, theta=t) for s, t in enumerate((0.01, 0.05, 0.2, 1.0))]
    model(collate_meshes(graphs)).square().sum().backward()
    for block in model.blocks:
        index = block.mixture.last_routing.index
        used = set(index.tolist())
        for k, kernel in enumerate(block.mixture.kernels):
            has_grad = [p.grad is not None for p in kernel.parameters()]
            assert all(has_grad) if k in used else not any(has_grad)
    # the gate reads theta: another theta, another routing somewhere (the gates are random, so
    # check that each gate's choice follows its scores, which change with theta)
    gate = model.blocks[0].mixture.gate
    inputs = model.gate_input(collate_meshes(graphs))
    assert torch.equal(model.blocks[0].mixture.last_routing.index, gate(inputs).index)
    assert not torch.allclose(gate(inputs).probs[0], gate(inputs).probs[-1])


def test_boundary_data_reach_the_prediction_only_through_the_boundary_transfer():
    a = sample(3)
    changed = disk_with_hole(seed=3)
    changed.update(theta=a.theta, edge_index=a.edge_index)
    rim = changed["boundary_segment"] == 1
    changed["boundary_values"] = changed["boundary_values"].clone()
    changed["boundary_values"][rim] += 2.0
    b = MeshSample(**changed)
    for transfer, nodes, moves in ((True, False, True), (True, True, True), (False, False, False)):
        model = tiny(boundary_transfer=transfer, boundary_nodes=nodes)
        diff = (model(collate_meshes([a])) - model(collate_meshes([b]))).abs().max()
        assert (diff > 1e-5) == moves, (transfer, nodes, float(diff))


@pytest.mark.parametrize("option, added", [("local", "local"), ("boundary_nodes", "to_boundary_nodes")])
def test_an_option_adds_its_path_and_nothing_else(option, added):
    """With the option's new layer zeroed, the model is the one without the option (same weights
    otherwise); with it, the prediction moves, and the layer learns."""
    graphs = collate_meshes([sample(1, theta=0.05), sample(2, theta=0.8)])
    plain, extended = tiny(), tiny(**{option: True})
    missing, unexpected = extended.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(f".{added}." in name for name in missing)
    y = extended(graphs)
    assert (y - plain(graphs)).abs().max() > 1e-4
    y.square().sum().backward()
    assert all(p.grad is not None for b in extended.blocks for p in getattr(b, added).parameters())
    with torch.no_grad():
        for name, p in extended.named_parameters():
            if f".{added}." in name and (name.endswith(".weight") or name.endswith(".bias")):
                p.zero_()
    torch.testing.assert_close(extended(graphs), plain(graphs), rtol=1e-5, atol=1e-6)


def overfit_and_round_trip(model, folder) -> None:
    """A model of meshes fits two graphs (loss down 20x in 150 steps), and its checkpoint
    rebuilds the same model (shared with the graph baseline's tests)."""
    data = collate_meshes([sample(4, theta=0.02), sample(5, theta=0.5)])
    assert mesh_loss_ratio(model, data, steps=150, lr=3e-3) < 0.05
    save_checkpoint(model, folder / "m")
    back = from_checkpoint(folder / "m")
    torch.testing.assert_close(back(data), model(data))


@pytest.mark.parametrize("kwargs", [{}, OPTIONS], ids=["default", "options"])
def test_a_tiny_overfit_and_a_checkpoint_round_trip(tmp_path, kwargs):
    overfit_and_round_trip(tiny(latent=32, **kwargs), tmp_path)


def test_bad_configurations_and_inputs_are_named():
    with pytest.raises(ValueError, match="n_kernels=3: the gate needs parameters"):
        get_model("gno_mesh", n_params=0, n_kernels=3)
    with pytest.raises(ValueError, match="kernel: expected one of attention, integral, got 'gcn'"):
        get_model("gno_mesh", kernel="gcn")
    with pytest.raises(ValueError, match="boundary_nodes=True: the boundary nodes' vectors come from the boundary "
                                         "transfer; set boundary_transfer=True"):
        get_model("gno_mesh", boundary_transfer=False, boundary_nodes=True)
    model = tiny()
    no_edges = disk_with_hole(seed=6)
    with pytest.raises(ValueError, match=r"data.edge_index: GNOMesh needs it"):
        model(collate_meshes([MeshSample(**no_edges)]))
    two_frames = disk_with_hole(seed=6)
    two_frames.update(u_in=torch.randn(38, 2, 1), edge_index=radius_edges(two_frames["pos"], 0.45))
    with pytest.raises(ValueError, match=r"data.u_in: expected shape \(N, 1, 1\), got \(38, 2, 1\)"):
        model(collate_meshes([MeshSample(**two_frames)]))


def test_without_torch_geometric_the_model_names_the_package(monkeypatch):
    import sys

    from gno_ext.models import MissingDependencyError, _load_gno_mesh

    monkeypatch.setitem(sys.modules, "torch_geometric", None)  # an import of it now fails
    with pytest.raises(MissingDependencyError, match="gno_mesh needs torch-geometric: pip install torch-geometric"):
        _load_gno_mesh()
