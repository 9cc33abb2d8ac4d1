"""The graph baseline of the mesh recipes (`mesh_gnn`): the same inputs as the mesh GNO as node
features; node-order equivariance, batch independence, every input reaching the prediction, a
tiny overfit."""

import pytest
import torch

pytest.importorskip("torch_geometric")

from gno_ext.mesh import MeshSample, collate_meshes  # noqa: E402
from gno_ext.models import get_model  # noqa: E402
from tests.models.test_gno_mesh import overfit_and_round_trip, permuted, sample  # noqa: E402
from tests.test_mesh import disk_with_hole  # noqa: E402


def tiny(**kw):
    args = dict(n_params=1, field_channels=2, log_params=[True], latent=16, depth=2, kernel_hidden=16)
    args.update(kw)
    torch.manual_seed(0)
    model = get_model("mesh_gnn", **args)
    model.param_norm.fit(torch.logspace(-2, 0, 16)[:, None])
    return model


def test_node_order_and_batch_independence():
    model = tiny()
    a, b = sample(1, theta=0.05), sample(2, theta=0.8, n_outer=8, n_inner=4, n_inside=9)
    y = model(collate_meshes([a, b]))
    assert y.shape == (a.n_nodes + b.n_nodes, 1, 1) and torch.isfinite(y).all()
    torch.testing.assert_close(model(collate_meshes([b])), y[a.n_nodes:], rtol=1e-5, atol=1e-5)
    perm = torch.randperm(a.n_nodes)
    torch.testing.assert_close(model(collate_meshes([permuted(a, perm)])), y[:a.n_nodes][perm], rtol=1e-5, atol=1e-5)


def test_theta_and_the_boundary_data_reach_the_prediction():
    model = tiny()
    a = sample(3, theta=0.1)
    base = model(collate_meshes([a]))
    other_theta = sample(3, theta=0.9)
    assert (model(collate_meshes([other_theta])) - base).abs().max() > 1e-5
    changed = disk_with_hole(seed=3)
    changed.update(theta=a.theta, edge_index=a.edge_index)
    rim = changed["boundary_segment"] == 1
    changed["boundary_values"] = changed["boundary_values"].clone()
    changed["boundary_values"][rim] += 2.0
    moved = (model(collate_meshes([MeshSample(**changed)])) - base).abs().squeeze()
    assert moved.max() > 1e-5
    # one kernel block per depth: the change reaches only nodes within `depth` edges of the rim
    near = set(a.boundary_index[rim].tolist())
    for _ in range(2):
        near |= {int(j) for i, j in a.edge_index.T.tolist() if i in near}
    far = torch.tensor([i not in near for i in range(a.n_nodes)])
    assert far.any() and moved[far].max() < 1e-6


def test_a_tiny_overfit_and_a_checkpoint_round_trip(tmp_path):
    overfit_and_round_trip(tiny(latent=32), tmp_path)
