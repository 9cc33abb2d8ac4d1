"""Mesh batches padded to bucketed sizes (`gno_ext.mesh.pad_meshes`), what a captured mesh
training step needs: the real graphs' predictions, losses and groups are those of the unpadded
batch, the shapes take few values, and the models read nothing from the device on a padded
batch (a whole-graph compile with no graph break stands for a CUDA graph on this CPU)."""

import contextlib

import pytest
import torch

pytest.importorskip("torch_geometric")

from gno_ext.mesh import MeshSample, PaddedMeshes, bucket, collate_meshes, pad_meshes, radius_edges  # noqa: E402
from gno_ext.models import get_model  # noqa: E402
from gno_ext.training.captured import signature  # noqa: E402
from gno_ext.training.problem import MeshProblem, problem_for  # noqa: E402
from gno_ext.training.steps import make_objective  # noqa: E402
from tests.test_mesh import disk_with_hole  # noqa: E402


def samples(sizes=((12, 6, 20), (8, 4, 9), (10, 5, 14)), robin=False):
    out = []
    for seed, (n_outer, n_inner, n_inside) in enumerate(sizes):
        values = disk_with_hole(n_outer, n_inner, n_inside, seed=seed, robin=robin)
        values.update(theta=torch.tensor([0.05 * 4 ** seed]), edge_index=radius_edges(values["pos"], 0.45))
        out.append(MeshSample(**values))
    return out


def model(name, **kw):
    torch.manual_seed(0)
    args = dict(n_params=1, field_channels=2, log_params=[True], latent=16, depth=2)
    if name == "gno_mesh":
        args.update(heads=2, n_kernels=3, gate_hidden=8)
    net = get_model(name, **{**args, **kw})
    net.param_norm.fit(torch.logspace(-2, 0, 16)[:, None])
    return net


def test_bucket_sizes():
    assert [bucket(n) for n in (0, 5, 8, 9, 16, 17, 100, 1000, 17000)] == [0, 5, 8, 9, 16, 18, 104, 1024, 18432]
    assert all(n <= bucket(n) <= n * 9 / 8 + 1 for n in range(1, 5000))
    assert len({bucket(n) for n in range(14000, 16000)}) == 3  # a batch's node counts: a few shapes
    with pytest.raises(ValueError, match="power of two"):
        bucket(10, per_octave=6)


def test_a_padded_batch_has_bucketed_sizes_and_one_padding_graph():
    batch = collate_meshes(samples(robin=True))
    padded = pad_meshes(batch)
    n, e, m = batch.num_nodes, batch.edge_index.shape[1], batch.boundary_index.numel()
    assert (padded.graphs, padded.num_graphs, padded.n_segments) == (3, 4, 2)
    assert padded.pos.shape[0] == bucket(n + 1) and padded.edge_index.shape[1] == bucket(e)
    assert padded.boundary_index.shape[0] == bucket(m + 2) and padded.boundary_coeffs.shape[0] == bucket(m + 2)
    assert (padded.batch[n:] == 3).all() and (padded.batch[:n] == batch.batch).all()
    loops = padded.edge_index[:, e:]
    assert (loops[0] == loops[1]).all() and (loops >= n).all() and (padded.boundary_index[m:] >= n).all()
    assert set(padded.boundary_segment[m:].tolist()) == {0, 1}  # every segment in the padding graph too
    assert torch.equal(padded.theta[:3], batch.theta)
    # batches of 20 different node counts: a few signatures (each one captured graph); the
    # buckets of these small batches coarsened as those of a bench batch (~17,000 nodes) are
    batches = [collate_meshes(samples(((12, 6, 20 + k), (8, 4, 9), (10, 5, 14)))) for k in range(20)]
    raw = {(b.num_nodes, b.edge_index.shape[1]) for b in batches}
    assert len(raw) == 20 and len({signature(pad_meshes(b, per_octave=2)) for b in batches}) <= 4


def test_the_padding_is_dealt_over_many_nodes():
    """A bench-sized batch (thousands of padding edges): no padding node takes more than a few of
    them (one node holding them all serialises a GPU's scatters into its row), and there is at
    least one padding node per 64 real ones."""
    big = collate_meshes(samples(((60, 30, 900), (50, 25, 700))))
    n, e, m = big.num_nodes, big.edge_index.shape[1], big.boundary_index.numel()
    padded = pad_meshes(big, per_octave=2)  # coarse buckets: much padding
    n_pad = padded.pos.shape[0] - n
    assert n_pad >= n // 64 and padded.edge_index.shape[1] - e > 20 * n_pad
    per_node = torch.bincount(padded.edge_index[0, e:] - n, minlength=n_pad)
    assert per_node.max() - per_node.min() <= 1  # dealt in turn
    ends = torch.bincount(padded.boundary_index[m:] - n, minlength=n_pad)
    assert ends.max() <= -(-(padded.boundary_index.numel() - m) // n_pad)


def test_a_captured_step_copies_a_new_padded_batch_into_its_static_one():
    from gno_ext.training.captured import _clone, _copy_into

    first = pad_meshes(collate_meshes(samples()))
    static = _clone(first)
    assert static.pos is not first.pos and torch.equal(static.pos, first.pos) and static.graphs == first.graphs
    second = pad_meshes(collate_meshes(samples()[::-1]))
    assert signature(second) == signature(first)  # the same sizes, other values
    _copy_into(static, second)
    assert all(torch.equal(getattr(static, k), getattr(second, k)) for k in ("pos", "edge_index", "batch", "theta"))


def test_a_graph_without_one_of_the_segments_is_refused():
    lone = disk_with_hole(seed=1)
    keep = lone["boundary_segment"] == 0
    for key in ("boundary_index", "boundary_kind", "boundary_values", "boundary_normal", "boundary_segment"):
        lone[key] = lone[key][keep]
    lone.update(edge_index=radius_edges(lone["pos"], 0.45))
    with pytest.raises(ValueError, match="graph 1 of the batch has no boundary node of segment 1"):
        pad_meshes(collate_meshes([samples()[0], MeshSample(**lone)]))


CASES = [("gno_mesh", dict(soft_routing=True, boundary_nodes=True)), ("gno_mesh", {}),
         ("gno_mesh", dict(kernel="integral", relative_positions=True, local=True)), ("mesh_gnn", {})]
IDS = ["gno_mesh", "gno_mesh-hard", "gno_mesh-integral", "mesh_gnn"]


@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_padding_changes_nothing_on_the_real_graphs(name, kwargs):
    net = model(name, **kwargs)
    batch = collate_meshes(samples())
    padded = pad_meshes(batch)
    y, y_pad = net(batch), net(padded)
    n = batch.num_nodes
    torch.testing.assert_close(y_pad[:n], y, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(y_pad).all()
    problem = MeshProblem(pad=True)
    target = batch.u_out[:, :1]
    target_pad = padded.u_out[:, :1]
    torch.testing.assert_close(problem.mse(y_pad, target_pad, padded), problem.mse(y, target, batch))
    torch.testing.assert_close(problem.nmse(y_pad, target_pad, padded), problem.nmse(y, target, batch))
    assert torch.equal(problem.segment_kinds(padded), problem.segment_kinds(batch))

    def binner(theta, kinds):  # a group per parameter value and boundary configuration
        assert theta.shape[0] == kinds.shape[0]
        return (theta[:, 0] * 1000).long() * 10 + kinds.sum(1)

    assert torch.equal(problem.groups(binner, padded), problem.groups(binner, batch))
    assert problem.size(padded) == problem.size(batch) == 3
    assert problem.finite(padded).shape == (3,)
    # gradients too: the loss of the padded batch trains the model as the unpadded one does
    # (a kernel no graph selected gets no gradient unpadded and a zero one padded: the same update)
    grads = []
    for b in (batch, padded):
        net.zero_grad(set_to_none=True)
        problem.mse(net(b), b.u_out[:, :1], b).sum().backward()
        grads.append({k: torch.zeros_like(p) if p.grad is None else p.grad.clone() for k, p in net.named_parameters()})
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_on_a_padded_batch_the_models_read_nothing_from_the_device(name, kwargs):
    """``fullgraph=True``: dynamo refuses any graph break, which a value read on the host (a
    ``.item()``, a ``unique``, a size from ``max()``) would make; the unpadded batch makes one."""
    torch._dynamo.reset()
    net = model(name, **kwargs)
    padded = pad_meshes(collate_meshes(samples()))
    compiled = torch.compile(net, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(padded), net(padded))
    if name == "gno_mesh":
        with pytest.raises(Exception):  # noqa: B017 (dynamo's error types change between versions)
            torch._dynamo.reset()
            torch.compile(net, backend="eager", fullgraph=True)(collate_meshes(samples()))


def test_the_objective_of_a_padded_batch_is_the_unpadded_ones():
    net = model("gno_mesh", soft_routing=True, boundary_nodes=True)
    batch = collate_meshes(samples())
    problem = problem_for({"kind": "mesh"}, capture=True)
    assert problem.pad and not problem_for({"kind": "mesh"}).pad
    padded = problem.train_collate(samples())
    assert isinstance(padded, PaddedMeshes) and not isinstance(MeshProblem().train_collate(samples()), PaddedMeshes)
    objective = make_objective(net, net, contextlib.nullcontext, torch.ones(1, 1, 1), n_groups=4, tau=1.0, world=1,
                               problem=problem)
    groups = torch.tensor([0, 1, 3])
    for dro in (False, True):
        logged, loss = objective(batch, groups, dro)
        logged_pad, loss_pad = objective(padded, groups, dro)
        torch.testing.assert_close(loss_pad, loss)
        torch.testing.assert_close(logged_pad, logged)
