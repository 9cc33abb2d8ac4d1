"""`gno_ext.mesh`: the sample on an irregular domain, its checks, and its round trip through
torch-geometric's ``Data`` and ``Batch``."""

import math

import pytest
import torch

from gno_ext.mesh import MeshSample, collate_meshes, split_meshes
from gno_ext.schema import BCType


def disk_with_hole(n_outer=12, n_inner=6, n_inside=20, seed=0, robin=False):
    """Nodes of an annulus 0.3 < r < 1: the outer circle Dirichlet (segment 0), the hole's rim
    Neumann or Robin (segment 1), interior points in between."""
    g = torch.Generator().manual_seed(seed)
    a_out = torch.linspace(0, 2 * math.pi, n_outer + 1)[:-1]
    a_in = torch.linspace(0, 2 * math.pi, n_inner + 1)[:-1]
    r = 0.35 + 0.6 * torch.rand(n_inside, generator=g)
    a = 2 * math.pi * torch.rand(n_inside, generator=g)
    outer = torch.stack([a_out.cos(), a_out.sin()], 1)
    inner = 0.3 * torch.stack([a_in.cos(), a_in.sin()], 1)
    pos = torch.cat([torch.stack([r * a.cos(), r * a.sin()], 1), outer, inner])
    n = pos.shape[0]
    boundary = torch.arange(n_inside, n)
    normal = torch.cat([outer, -inner / 0.3])  # outward: away from the centre outside, towards it in the hole
    kind = torch.cat([torch.full((n_outer,), int(BCType.DIRICHLET)),
                      torch.full((n_inner,), int(BCType.ROBIN if robin else BCType.NEUMANN))])
    return dict(pos=pos, u_in=torch.randn(n, 1, 1, generator=g), u_out=torch.randn(n, 1, 1, generator=g),
                theta=torch.tensor([0.1]), boundary_index=boundary, boundary_kind=kind,
                boundary_values=torch.randn(n_outer + n_inner, 2, generator=g), boundary_normal=normal,
                boundary_segment=torch.cat([torch.zeros(n_outer), torch.ones(n_inner)]).long(),
                boundary_coeffs=torch.tensor([[1.0, 0.5]]).expand(n_outer + n_inner, 2).clone() if robin else None,
                theta_field=torch.randn(n, 2, generator=g))


def test_a_sample_round_trips_through_data():
    pytest.importorskip("torch_geometric")
    s = MeshSample(**disk_with_hole(), dt=0.01, group=3)
    assert (s.n_nodes, s.ndim, s.n_segments) == (38, 2, 2)
    back = MeshSample.from_data(s.to_data())
    for name in ("pos", "u_in", "u_out", "theta", "theta_field", "boundary_index", "boundary_kind", "boundary_values",
                 "boundary_normal", "boundary_segment"):
        assert torch.equal(getattr(back, name), getattr(s, name)), name
    assert back.dt == pytest.approx(0.01) and back.group == 3 and back.boundary_coeffs is None


def test_a_batch_offsets_the_boundary_nodes_but_not_the_segments_and_splits_back():
    pytest.importorskip("torch_geometric")
    a = MeshSample(**disk_with_hole(seed=1, robin=True))
    b = MeshSample(**disk_with_hole(n_outer=8, n_inner=4, n_inside=9, seed=2, robin=True))
    batch = collate_meshes([a, b])
    assert batch.num_graphs == 2 and batch.theta.shape == (2, 1) and batch.u_in.shape == (a.n_nodes + b.n_nodes, 1, 1)
    assert torch.equal(batch.boundary_index, torch.cat([a.boundary_index, b.boundary_index + a.n_nodes]))
    assert torch.equal(batch.boundary_segment, torch.cat([a.boundary_segment, b.boundary_segment]))
    # each boundary node's graph, from the node-to-graph vector
    assert torch.equal(batch.batch[batch.boundary_index],
                       torch.cat([torch.zeros(len(a.boundary_index)), torch.ones(len(b.boundary_index))]).long())
    # the boundary data stay with their nodes
    assert torch.equal(batch.pos[batch.boundary_index], torch.cat([a.pos[a.boundary_index], b.pos[b.boundary_index]]))
    for got, want in zip(split_meshes(batch), (a, b)):
        assert torch.equal(got.boundary_index, want.boundary_index) and torch.equal(got.u_out, want.u_out)
        assert torch.equal(got.boundary_coeffs, want.boundary_coeffs)


def test_samples_that_cannot_batch_are_named():
    pytest.importorskip("torch_geometric")
    a = MeshSample(**disk_with_hole())
    two_channels = disk_with_hole(seed=4)
    two_channels.update(u_in=torch.randn(38, 1, 2), u_out=torch.randn(38, 1, 2))
    with pytest.raises(ValueError, match=r"sample 1's u_in has shape \(38, 1, 2\), unlike sample 0's \(38, 1, 1\)"):
        collate_meshes([a, MeshSample(**two_channels)])
    no_field = disk_with_hole(seed=5)
    no_field["theta_field"] = None
    with pytest.raises(ValueError, match="sample 1 lacks theta_field, unlike sample 0"):
        collate_meshes([a, MeshSample(**no_field)])
    with pytest.raises(ValueError, match="no samples"):
        collate_meshes([])


def _bad(**change):
    values = disk_with_hole()
    for key, fn in change.items():
        values[key] = fn(values[key]) if callable(fn) else fn
    return values


@pytest.mark.parametrize("change,error,message", [
    (dict(pos=lambda p: p[:, :1]), ValueError, r"MeshSample.pos: expected shape \(N, d\) .* got \(38, 1\)"),
    (dict(u_in=lambda u: u[:5]), ValueError, r"MeshSample.u_in: expected shape \(38, T, C\)"),
    (dict(u_out=lambda u: u.repeat(1, 1, 2)), ValueError, "u_in has 1 channels but u_out has 2"),
    (dict(theta=lambda t: t[None]), ValueError, r"MeshSample.theta: expected shape \(P,\)"),
    (dict(theta_field=lambda f: f[:3]), ValueError, r"MeshSample.theta_field: expected shape \(38, C_f\)"),
    (dict(boundary_kind=lambda k: k[:-1]), ValueError, r"MeshSample.boundary_kind: expected shape \(18,\)"),
    (dict(boundary_normal=lambda n: n[:, :1]), ValueError, r"MeshSample.boundary_normal: expected shape \(18, 2\)"),
    (dict(boundary_values=lambda v: v[:, :0]), ValueError, r"MeshSample.boundary_values: expected shape \(18, T_bc\)"),
    (dict(boundary_index=lambda i: i.float()), TypeError, "MeshSample.boundary_index: expected an integer tensor"),
    (dict(u_in=lambda u: u.long()), TypeError, "MeshSample.u_in: expected a floating tensor"),
    (dict(u_out=lambda u: u.index_fill(0, torch.tensor([7]), float("nan"))), ValueError,
     r"MeshSample.u_out: holds NaN or Inf \(first at \[7, 0, 0\]\)"),
    (dict(boundary_values=lambda v: v.index_fill(0, torch.tensor([2]), float("inf"))), ValueError,
     "MeshSample.boundary_values: holds NaN or Inf"),
    (dict(boundary_index=lambda i: i + 1), ValueError, r"boundary_index: node ids must lie in \[0, 38\), got 21 to 38"),
    (dict(boundary_index=lambda i: i.index_fill(0, torch.tensor([1]), int(i[0]))), ValueError, "a node is listed twice"),
    (dict(boundary_kind=lambda k: k.index_fill(0, torch.tensor([0]), 9)), ValueError,
     r"boundary_kind: unknown boundary type code\(s\) \[9\]"),
    (dict(boundary_kind=lambda k: torch.zeros_like(k)), ValueError, "periodic boundary nodes"),
    (dict(boundary_normal=lambda n: 2 * n), ValueError, "expected outward unit normals; boundary node 0 has length 2"),
    (dict(boundary_segment=lambda s: s.index_fill(0, torch.tensor([0]), 1)), ValueError,
     r"segment 1 mixes the types \['dirichlet', 'neumann'\]"),
    (dict(boundary_segment=lambda s: 2 * s), ValueError, r"ids must be 0..S-1 without gaps, got \[0, 2\]"),
    (dict(boundary_kind=lambda k: k.masked_fill(k == int(BCType.NEUMANN), int(BCType.ROBIN))), ValueError,
     r"Robin boundary nodes need their coefficients \(a, b\)"),
])
def test_a_bad_sample_is_refused_with_a_message_that_names_it(change, error, message):
    with pytest.raises(error, match=message):
        MeshSample(**_bad(**change))


def test_data_without_a_mesh_samples_attributes_is_refused():
    tg = pytest.importorskip("torch_geometric")
    data = MeshSample(**disk_with_hole()).to_data()
    del data.boundary_normal
    with pytest.raises(ValueError, match=r"missing attribute\(s\) \['boundary_normal'\]"):
        MeshSample.from_data(data)
    with pytest.raises(ValueError, match=r"Data.theta: expected shape \(1, P\)"):
        MeshSample.from_data(tg.data.Data(**{**MeshSample(**disk_with_hole()).to_data().to_dict(),
                                             "theta": torch.zeros(2, 1)}))


def test_edges_are_checked_offset_in_a_batch_and_radius_edges_are_the_close_pairs():
    pytest.importorskip("torch_geometric")
    from gno_ext.mesh import radius_edges

    a_kw, b_kw = disk_with_hole(seed=1), disk_with_hole(n_outer=8, n_inner=4, n_inside=9, seed=2)
    for kw in (a_kw, b_kw):
        kw["edge_index"] = radius_edges(kw["pos"], 0.4)
    a, b = MeshSample(**a_kw), MeshSample(**b_kw)
    pairs = {(int(s), int(t)) for s, t in a.edge_index.t()}
    want = {(j, i) for i in range(a.n_nodes) for j in range(a.n_nodes)
            if i != j and float((a.pos[i] - a.pos[j]).norm()) < 0.4}
    assert pairs == want and len(pairs) > a.n_nodes  # every close pair, each direction, no self-loop
    batch = collate_meshes([a, b])
    assert torch.equal(batch.edge_index, torch.cat([a.edge_index, b.edge_index + a.n_nodes], 1))
    assert torch.equal(radius_edges(batch.pos, 0.4, batch.batch), batch.edge_index)  # never across graphs
    assert torch.equal(split_meshes(batch)[1].edge_index, b.edge_index)
    for edges, message in [(torch.tensor([[0, 1], [1, 38]]), r"edge_index: node ids must lie in \[0, 38\)"),
                           (torch.tensor([[2], [2]]), "joins a node to itself"),
                           (torch.tensor([0, 1]), r"edge_index: expected an integer tensor of shape \(2, E\)")]:
        with pytest.raises(ValueError, match=message):
            MeshSample(**{**a_kw, "edge_index": edges})
    with pytest.raises(ValueError, match="radius: expected a positive distance"):
        radius_edges(a.pos, 0.0)
