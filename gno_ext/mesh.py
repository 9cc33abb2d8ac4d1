r"""The sample on an irregular domain: nodes of a mesh or point set, with their boundary.

The grid schema (`gno_ext.schema`) describes a box by its faces; an irregular domain has no
faces, so its boundary is a set of *boundary nodes*, each with its condition type, its data,
its outward unit normal and the boundary *segment* it belongs to (a piece of the boundary with
one condition: the outer wall of a disk with a hole, the hole's rim, the two legs of an L).

Arrays are node-major, so that the samples of a batch concatenate along the nodes as
torch-geometric batches graphs:

| attribute | shape | meaning |
| --- | --- | --- |
| ``pos`` | (N, d) | node positions, ``d`` = 2 or 3 |
| ``u_in``, ``u_out`` | (N, T_in, C), (N, T_out, C) | input and target frames at the nodes |
| ``theta`` | (P,) | scalar PDE parameters, raw units |
| ``theta_field`` | (N, C_f), optional | spatially varying coefficients (an advection velocity) |
| ``boundary_index`` | (M,) long | the boundary nodes, distinct, in ``[0, N)`` |
| ``boundary_kind`` | (M,) long | `BCType` of each boundary node (not periodic) |
| ``boundary_values`` | (M, T_bc) | the data: Dirichlet value, Neumann outward flux, Robin ``g``, at ``T_bc`` times |
| ``boundary_normal`` | (M, d) | outward unit normals |
| ``boundary_segment`` | (M,) long | segment of each boundary node, ``0..S-1``; one condition type per segment |
| ``boundary_coeffs`` | (M, 2), optional | Robin ``(a, b)`` of $a u + b\,\partial_n u = g$ |
| ``edge_index`` | (2, E) long, optional | directed edges source -> target between distinct nodes: a mesh's edges, or `radius_edges` of a point set |

`MeshSample.to_data` and `MeshSample.from_data` convert to and from
``torch_geometric.data.Data``; `collate_meshes` makes a ``torch_geometric.data.Batch``, in which
``boundary_index`` is offset by the nodes of the graphs before (torch-geometric does it for any
attribute whose name holds ``index``), ``boundary_segment`` is not, and ``theta`` is
``(B, P)``. A sample is checked when it is made and when it comes back from a ``Data``: a
wrong shape, an unknown boundary type or a NaN raises an error that names the attribute.

`pad_meshes` pads a batch to bucketed sizes with one padding graph (`PaddedMeshes`), so that
its shapes take few values and the models read its sizes from it, not from the device: the
batches of a training step replayed from CUDA graphs (``trainer.capture=true``).

torch-geometric is an optional dependency (``pip install gno-ext[mesh]``); `MeshSample` itself
does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from gno_ext.schema import BCType

__all__ = ["MeshSample", "PaddedMeshes", "bucket", "collate_meshes", "pad_meshes", "radius_edges", "split_meshes"]

BOUNDARY_FIELDS = ("boundary_index", "boundary_kind", "boundary_values", "boundary_normal", "boundary_segment",
                   "boundary_coeffs")
NORMAL_TOLERANCE = 1e-3  # |1 - |n|| allowed for a unit normal


@dataclass
class MeshSample:
    """One window of a trajectory on an irregular domain (see the module's table).

    Parameters
    ----------
    pos, u_in, u_out, theta, boundary_index, boundary_kind, boundary_values, boundary_normal,
    boundary_segment
        As in the module's table.
    boundary_coeffs, theta_field : Tensor, optional
    dt : float
        Time between consecutive frames.
    group : int
        Group id for group DRO.
    meta : dict
        Free-form provenance (not carried into ``Data``).
    """

    pos: Tensor
    u_in: Tensor
    u_out: Tensor
    theta: Tensor
    boundary_index: Tensor
    boundary_kind: Tensor
    boundary_values: Tensor
    boundary_normal: Tensor
    boundary_segment: Tensor
    boundary_coeffs: Tensor | None = None
    theta_field: Tensor | None = None
    edge_index: Tensor | None = None
    dt: float = 1.0
    group: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self)

    @property
    def n_nodes(self) -> int:
        return self.pos.shape[0]

    @property
    def ndim(self) -> int:
        return self.pos.shape[1]

    @property
    def n_segments(self) -> int:
        return int(self.boundary_segment.max()) + 1 if self.boundary_segment.numel() else 0

    def to_data(self) -> Any:
        """The sample as a ``torch_geometric.data.Data`` (``theta`` as ``(1, P)``, ``dt`` and
        ``group`` as one-element tensors, so that they batch to ``(B, ...)``)."""
        from torch_geometric.data import Data

        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("meta", "theta", "dt", "group")}
        values = {k: v for k, v in values.items() if v is not None}
        return Data(**values, theta=self.theta[None], dt=torch.tensor([float(self.dt)]),
                    group=torch.tensor([int(self.group)]), num_nodes=self.n_nodes)

    @classmethod
    def from_data(cls, data: Any) -> MeshSample:
        """The sample of one graph (a ``Data``, or one graph of a ``Batch`` from
        ``Batch.get_example``), checked."""
        keys = set(data.keys())
        missing = [k for k in ("pos", "u_in", "u_out", "theta", *BOUNDARY_FIELDS[:5]) if k not in keys]
        if missing:
            raise ValueError(f"Data: missing attribute(s) {missing} of a mesh sample")
        theta = data.theta
        if theta.ndim != 2 or theta.shape[0] != 1:
            raise ValueError(f"Data.theta: expected shape (1, P), got {tuple(theta.shape)}")
        optional = {k: data[k] for k in ("boundary_coeffs", "theta_field", "edge_index") if k in keys}
        return cls(pos=data.pos, u_in=data.u_in, u_out=data.u_out, theta=theta[0],
                   **{k: data[k] for k in BOUNDARY_FIELDS[:5]}, **optional,
                   dt=float(data.dt[0]) if "dt" in keys else 1.0, group=int(data.group[0]) if "group" in keys else 0)


def collate_meshes(samples: Sequence[MeshSample]) -> Any:
    """A ``torch_geometric.data.Batch`` of the samples (``batch``: each node's graph;
    ``boundary_index`` offset to the batch's nodes; ``theta`` (B, P)). The samples must agree in
    dimension, frames, channels, parameters and boundary times."""
    from torch_geometric.data import Batch

    if not samples:
        raise ValueError("collate_meshes: no samples")
    first = samples[0]
    for i, s in enumerate(samples[1:], 1):
        for name, a, b in (("pos", first.pos.shape[1], s.pos.shape[1]),
                           ("u_in", first.u_in.shape[1:], s.u_in.shape[1:]),
                           ("u_out", first.u_out.shape[1:], s.u_out.shape[1:]),
                           ("theta", first.theta.shape, s.theta.shape),
                           ("boundary_values", first.boundary_values.shape[1:], s.boundary_values.shape[1:])):
            if a != b:
                raise ValueError(f"collate_meshes: sample {i}'s {name} has shape {tuple(s.__dict__[name].shape)}, "
                                 f"unlike sample 0's {tuple(first.__dict__[name].shape)} (per-node sizes must agree)")
        for name in ("theta_field", "boundary_coeffs", "edge_index"):
            if (getattr(first, name) is None) != (getattr(s, name) is None):
                raise ValueError(f"collate_meshes: sample {i} {'lacks' if getattr(s, name) is None else 'has'} "
                                 f"{name}, unlike sample 0")
    return Batch.from_data_list([s.to_data() for s in samples])


def bucket(n: int, per_octave: int = 8) -> int:
    """The smallest size ``>= n`` of the form ``k 2^e`` with ``per_octave <= k < 2 per_octave``
    (``n`` itself up to ``per_octave``): sizes that vary from batch to batch fall into few
    buckets, each at most ``1 / per_octave`` larger than what it holds."""
    if per_octave < 1 or per_octave & (per_octave - 1):
        raise ValueError(f"per_octave: expected a power of two, got {per_octave}")
    if n <= per_octave:
        return max(int(n), 0)
    unit = 1 << (int(n).bit_length() - per_octave.bit_length())
    return -(-int(n) // unit) * unit


@dataclass
class PaddedMeshes:
    """A batch of mesh samples padded to bucketed sizes (`pad_meshes`): the attributes of
    `collate_meshes`'s batch that the models and the loss read, with the nodes, edges and
    boundary nodes of one *padding graph* appended after the ``graphs`` real ones, so that a
    batch's tensor shapes take few values and its sizes are known on the host without reading
    the device (what a CUDA graph needs). ``num_graphs`` counts the padding graph;
    ``n_segments`` is every graph's number of boundary segments."""

    pos: Tensor
    u_in: Tensor
    u_out: Tensor
    theta: Tensor
    edge_index: Tensor
    batch: Tensor
    boundary_index: Tensor
    boundary_kind: Tensor
    boundary_values: Tensor
    boundary_normal: Tensor
    boundary_segment: Tensor
    graphs: int
    n_segments: int
    theta_field: Tensor | None = None
    boundary_coeffs: Tensor | None = None

    @property
    def num_graphs(self) -> int:
        return self.graphs + 1

    def _map(self, fn: Any) -> PaddedMeshes:
        return PaddedMeshes(**{f.name: fn(v) if isinstance(v, Tensor) else v
                               for f in fields(self) for v in [getattr(self, f.name)]})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PaddedMeshes:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> PaddedMeshes:
        """Pin the host tensors (called by ``DataLoader(pin_memory=True)``)."""
        return self._map(Tensor.pin_memory)


def pad_meshes(batch: Any, per_octave: int = 8) -> PaddedMeshes:
    """``batch`` (`collate_meshes`'s, on the host) padded to `bucket` sizes (`PaddedMeshes`).

    The padding graph has the remaining nodes (at the origin, fields zero; at least one per 64
    real nodes), the remaining edges as self-loops and the remaining boundary entries (a
    Dirichlet condition with zero data, spread over every segment) dealt in turn to its nodes:
    no node gathers thousands of them, whose additions into its row a GPU would make one after
    another; its parameters are the first graph's. No edge joins it to a real graph, so the real
    graphs' predictions are those of the unpadded batch (the models treat each graph apart); a
    per-graph loss reads the first ``graphs`` entries. Every graph must have every segment
    ``0 .. S-1`` (the padded segment tokens are then ``S`` per graph): a batch in which one lacks
    one is refused by name."""
    graphs, nodes = int(batch.num_graphs), int(batch.num_nodes)
    edges, boundary = int(batch.edge_index.shape[1]), int(batch.boundary_index.numel())
    segment = batch.boundary_segment.long()
    n_segments = int(segment.max()) + 1 if boundary else 0
    if n_segments == 0:
        raise ValueError("pad_meshes: the batch has no boundary nodes")
    present = torch.zeros(graphs, n_segments, dtype=torch.bool)
    present[batch.batch[batch.boundary_index], segment] = True
    if not present.all():
        g, s = (int(i) for i in (~present).nonzero()[0])
        raise ValueError(f"pad_meshes: graph {g} of the batch has no boundary node of segment {s} (of "
                         f"{n_segments}); padded batches need every segment in every graph")
    n_pad = bucket(nodes + max(1, nodes // 64), per_octave) - nodes
    e_pad, m_pad = bucket(edges, per_octave) - edges, bucket(boundary + n_segments, per_octave) - boundary
    loops, ends = nodes + torch.arange(e_pad) % n_pad, nodes + torch.arange(m_pad) % n_pad  # dealt to the padding nodes

    def grow(t: Tensor, extra: int, fill: Tensor | float = 0.0) -> Tensor:
        tail = (fill.expand(extra, *t.shape[1:]) if isinstance(fill, Tensor)
                else torch.full((extra, *t.shape[1:]), fill, dtype=t.dtype))
        return torch.cat([t, tail.to(t.dtype)])

    normal = torch.zeros(batch.boundary_normal.shape[1], dtype=batch.boundary_normal.dtype)
    normal[0] = 1.0
    coeffs = getattr(batch, "boundary_coeffs", None)
    theta_field = getattr(batch, "theta_field", None)
    return PaddedMeshes(
        pos=grow(batch.pos, n_pad), u_in=grow(batch.u_in, n_pad), u_out=grow(batch.u_out, n_pad),
        theta=torch.cat([batch.theta, batch.theta[:1]]),
        edge_index=torch.cat([batch.edge_index, loops.expand(2, e_pad)], 1),
        batch=grow(batch.batch, n_pad, graphs),
        boundary_index=torch.cat([batch.boundary_index, ends]),
        boundary_kind=grow(batch.boundary_kind, m_pad, int(BCType.DIRICHLET)),
        boundary_values=grow(batch.boundary_values, m_pad), boundary_normal=grow(batch.boundary_normal, m_pad, normal),
        boundary_segment=torch.cat([segment, torch.arange(m_pad) % n_segments]),
        graphs=graphs, n_segments=n_segments,
        theta_field=None if theta_field is None else grow(theta_field, n_pad),
        boundary_coeffs=None if coeffs is None else grow(coeffs, m_pad))


def split_meshes(batch: Any) -> list[MeshSample]:
    """The samples of a ``Batch`` (`collate_meshes` undone), each checked."""
    return [MeshSample.from_data(batch.get_example(i)) for i in range(batch.num_graphs)]


def _check(s: MeshSample) -> None:
    """Shapes, types, finiteness and the boundary's consistency, with messages that name the
    attribute."""
    for name in ("pos", "u_in", "u_out", "theta", "boundary_values", "boundary_normal"):
        t = getattr(s, name)
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"MeshSample.{name}: expected a floating tensor, got "
                            f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")
    for name in ("boundary_index", "boundary_kind", "boundary_segment"):
        t = getattr(s, name)
        if not isinstance(t, Tensor) or t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"MeshSample.{name}: expected an integer tensor, got "
                            f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")
        setattr(s, name, t.long())
    if s.pos.ndim != 2 or s.pos.shape[1] not in (2, 3) or s.pos.shape[0] == 0:
        raise ValueError(f"MeshSample.pos: expected shape (N, d) with N >= 1 and d = 2 or 3, got {tuple(s.pos.shape)}")
    n, d = s.pos.shape
    for name in ("u_in", "u_out"):
        t = getattr(s, name)
        if t.ndim != 3 or t.shape[0] != n or 0 in t.shape:
            raise ValueError(f"MeshSample.{name}: expected shape ({n}, T, C) (node-major, T and C >= 1), "
                             f"got {tuple(t.shape)}")
    if s.u_in.shape[2] != s.u_out.shape[2]:
        raise ValueError(f"MeshSample: u_in has {s.u_in.shape[2]} channels but u_out has {s.u_out.shape[2]}")
    if s.theta.ndim != 1:
        raise ValueError(f"MeshSample.theta: expected shape (P,), got {tuple(s.theta.shape)}")
    if s.theta_field is not None and (s.theta_field.ndim != 2 or s.theta_field.shape[0] != n):
        raise ValueError(f"MeshSample.theta_field: expected shape ({n}, C_f), got {tuple(s.theta_field.shape)}")
    m = s.boundary_index.shape[0] if s.boundary_index.ndim == 1 else -1
    wanted = {"boundary_index": (m,), "boundary_kind": (m,), "boundary_segment": (m,),
              "boundary_normal": (m, d)}
    if m < 0:
        raise ValueError(f"MeshSample.boundary_index: expected shape (M,), got {tuple(s.boundary_index.shape)}")
    for name, shape in wanted.items():
        if tuple(getattr(s, name).shape) != shape:
            raise ValueError(f"MeshSample.{name}: expected shape {shape} (one row per boundary node), "
                             f"got {tuple(getattr(s, name).shape)}")
    if s.boundary_values.ndim != 2 or s.boundary_values.shape[0] != m or s.boundary_values.shape[1] == 0:
        raise ValueError(f"MeshSample.boundary_values: expected shape ({m}, T_bc) with T_bc >= 1, "
                         f"got {tuple(s.boundary_values.shape)}")
    if s.boundary_coeffs is not None and tuple(s.boundary_coeffs.shape) != (m, 2):
        raise ValueError(f"MeshSample.boundary_coeffs: expected shape ({m}, 2), got {tuple(s.boundary_coeffs.shape)}")
    for name in ("pos", "u_in", "u_out", "theta", "theta_field", "boundary_values", "boundary_normal",
                 "boundary_coeffs"):
        t = getattr(s, name)
        if t is not None and not torch.isfinite(t).all():
            bad = (~torch.isfinite(t)).nonzero()[0].tolist()
            raise ValueError(f"MeshSample.{name}: holds NaN or Inf (first at {bad})")
    index = s.boundary_index
    if m and (index.min() < 0 or index.max() >= n):
        raise ValueError(f"MeshSample.boundary_index: node ids must lie in [0, {n}), got {int(index.min())} "
                         f"to {int(index.max())}")
    if index.unique().numel() != m:
        raise ValueError("MeshSample.boundary_index: a node is listed twice (each boundary node once, "
                         "with one condition)")
    known = {member.value for member in BCType}
    unknown = sorted(set(s.boundary_kind.tolist()) - known)
    if unknown:
        raise ValueError(f"MeshSample.boundary_kind: unknown boundary type code(s) {unknown}; valid: "
                         f"{ {member.name: member.value for member in BCType} }")
    if (s.boundary_kind == BCType.PERIODIC).any():
        raise ValueError("MeshSample.boundary_kind: periodic boundary nodes; an irregular boundary has no "
                         "opposite face to wrap to (use the grid schema for a periodic box)")
    length = s.boundary_normal.norm(dim=1)
    off = (length - 1).abs() > NORMAL_TOLERANCE
    if off.any():
        first = int(off.nonzero()[0])
        raise ValueError(f"MeshSample.boundary_normal: expected outward unit normals; boundary node {first} "
                         f"has length {float(length[first]):.4g}")
    segment = s.boundary_segment
    if m:
        if segment.min() < 0:
            raise ValueError(f"MeshSample.boundary_segment: ids must be >= 0, got {int(segment.min())}")
        used = segment.unique()
        if used.numel() != int(segment.max()) + 1:
            raise ValueError(f"MeshSample.boundary_segment: ids must be 0..S-1 without gaps, got {used.tolist()}")
        for k in used.tolist():
            kinds = s.boundary_kind[segment == k].unique()
            if kinds.numel() > 1:
                names = [BCType(int(c)).name.lower() for c in kinds]
                raise ValueError(f"MeshSample.boundary_segment: segment {k} mixes the types {names}; a segment "
                                 "has one condition type")
    robin = s.boundary_kind == BCType.ROBIN
    if robin.any() and s.boundary_coeffs is None:
        raise ValueError("MeshSample.boundary_coeffs: Robin boundary nodes need their coefficients (a, b)")
    if s.edge_index is not None:
        e = s.edge_index
        if not isinstance(e, Tensor) or e.dtype not in (torch.int64, torch.int32) or e.ndim != 2 or e.shape[0] != 2:
            raise ValueError(f"MeshSample.edge_index: expected an integer tensor of shape (2, E), got "
                             f"{tuple(e.shape) if isinstance(e, Tensor) else type(e).__name__}")
        s.edge_index = e = e.long()
        if e.numel() and (e.min() < 0 or e.max() >= n):
            raise ValueError(f"MeshSample.edge_index: node ids must lie in [0, {n}), got {int(e.min())} to {int(e.max())}")
        if (e[0] == e[1]).any():
            raise ValueError("MeshSample.edge_index: an edge joins a node to itself (a kernel adds the node's own "
                             "term; list distinct nodes)")
    if not math.isfinite(float(s.dt)) or float(s.dt) <= 0:
        raise ValueError(f"MeshSample.dt: expected a positive time step, got {s.dt!r}")


def radius_edges(pos: Tensor, radius: float, batch: Tensor | None = None) -> Tensor:
    """Directed edges ``(2, E)`` (source, target) between the distinct nodes of one graph that lie
    closer than ``radius``: the neighbourhoods of a point set. ``batch`` (N,): each node's graph
    (edges stay within graphs). Computed from all pairwise distances of each graph (memory
    ``N_g^2``); for large graphs use torch-geometric's ``radius_graph`` (it needs torch-cluster
    or pyg-lib)."""
    if pos.ndim != 2:
        raise ValueError(f"pos: expected shape (N, d), got {tuple(pos.shape)}")
    if not radius > 0:
        raise ValueError(f"radius: expected a positive distance, got {radius!r}")
    batch = torch.zeros(pos.shape[0], dtype=torch.long, device=pos.device) if batch is None else batch
    edges = []
    for g in batch.unique().tolist():
        nodes = (batch == g).nonzero().squeeze(1)
        close = torch.cdist(pos[nodes], pos[nodes]) < radius
        close.fill_diagonal_(False)
        target, source = close.nonzero().unbind(1)
        edges.append(torch.stack([nodes[source], nodes[target]]))
    return torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long, device=pos.device)
