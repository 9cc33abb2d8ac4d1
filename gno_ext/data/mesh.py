r"""Heat datasets on an irregular domain (an annulus whose hole varies), written in a documented
HDF5 layout, and their reader into `gno_ext.mesh.MeshSample` windows.

Each trajectory draws:

* the hole's radius $r_{in} \sim U[0.2, 0.5]$ (outer radius 1), triangulated by
  `gno_ext.solvers.fem.annulus_mesh` with the dataset's ``rings`` and ``sectors`` (so every
  trajectory has the same node count and connectivity, at other positions);
* the diffusivity $\alpha$, log-uniform in ``alpha_range`` (the parameter $\theta$);
* a condition per boundary segment (the outer circle, segment 0; the hole's rim, segment 1):
  Dirichlet or Neumann with equal probability, and its constant datum $g \sim U[-1, 1]$ (the
  value, or the outward flux);
* a smooth random initial field, a sum of ``modes`` random plane waves of wave numbers up to 3,
  set to the Dirichlet data on Dirichlet segments;

and is solved by P1 finite elements with Crank-Nicolson (`gno_ext.solvers.fem.heat_fem`,
second order, verified), ``substeps`` steps per frame.

The HDF5 file (one per split), with ``n`` trajectories of ``T`` frames, ``N`` nodes and ``M``
boundary nodes:

| dataset | shape | meaning |
| --- | --- | --- |
| ``pos`` | (n, N, 2) | node positions |
| ``u`` | (n, T, N, 1) | the field at the frames |
| ``theta`` | (n, 1) | $\alpha$ |
| ``triangles`` | (n, K, 3) | the triangulation (counter-clockwise) |
| ``edge_index`` | (n, 2, E) | the mesh's edges, both directions |
| ``boundary_index`` | (n, M) | boundary nodes |
| ``boundary_kind`` | (n, M) | `BCType` codes |
| ``boundary_values`` | (n, M, 1) | the data (constant in time) |
| ``boundary_normal`` | (n, M, 2) | outward unit normals |
| ``boundary_segment`` | (n, M) | 0: outer circle, 1: the hole's rim |

with the attributes ``dataset_name``, ``dt`` (time between frames), ``parameter_names``
(``["alpha"]``), ``field_names`` (``["temperature"]``) and ``layout`` (``"gno_ext.mesh/1"``).
The file is written to a temporary name and renamed when complete.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from gno_ext.mesh import MeshSample
from gno_ext.schema import BCType
from gno_ext.solvers.fem import annulus_mesh, heat_fem

__all__ = ["LAYOUT", "MeshDataset", "generate_heat_annulus"]

LAYOUT = "gno_ext.mesh/1"
FIELDS = ("pos", "u", "theta", "triangles", "edge_index", "boundary_index", "boundary_kind", "boundary_values",
          "boundary_normal", "boundary_segment")


def generate_heat_annulus(path: str | Path, n_trajectories: int, frames: int = 11, dt: float = 0.02,
                          rings: int = 6, sectors: int = 24, alpha_range: tuple[float, float] = (0.1, 1.0),
                          modes: int = 4, substeps: int = 4, seed: int = 0) -> Path:
    """Write ``n_trajectories`` heat trajectories on annuli to ``path`` (see the module's text)."""
    if n_trajectories < 1 or frames < 2 or substeps < 1:
        raise ValueError(f"n_trajectories >= 1, frames >= 2 and substeps >= 1 expected, got {n_trajectories}, "
                         f"{frames}, {substeps}")
    lo, hi = alpha_range
    if not 0 < lo <= hi:
        raise ValueError(f"alpha_range: expected 0 < low <= high, got {alpha_range}")
    g = torch.Generator().manual_seed(seed)
    rows: dict[str, list[np.ndarray]] = {name: [] for name in FIELDS}
    for _ in range(n_trajectories):
        r_in = 0.2 + 0.3 * float(torch.rand((), generator=g))
        mesh = annulus_mesh(r_in, 1.0, rings, sectors)
        alpha = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * float(torch.rand((), generator=g)))
        dirichlet_segment = torch.rand(2, generator=g) < 0.5
        datum = 2 * torch.rand(2, generator=g, dtype=torch.float64) - 1
        on_dirichlet_edge = dirichlet_segment[mesh.edge_segment]
        node_value = _node_data(mesh, datum)
        u0 = _initial_field(mesh.nodes, modes, g)
        fixed = mesh.boundary_edges[on_dirichlet_edge].flatten().unique()
        u0[fixed] = node_value[fixed]
        frames_after = heat_fem(mesh, u0, alpha, dt * (frames - 1), substeps * (frames - 1), on_dirichlet_edge,
                                g_dirichlet=lambda x, t: node_value, g_neumann=lambda x, t: node_value,
                                record_every=substeps)
        u = torch.cat([u0[None], frames_after])
        boundary = mesh.boundary_nodes()
        segment = _node_segment(mesh, boundary)
        kind = torch.where(dirichlet_segment[segment], int(BCType.DIRICHLET), int(BCType.NEUMANN))
        normal = mesh.nodes[boundary] / mesh.nodes[boundary].norm(dim=1, keepdim=True)
        normal = torch.where((segment == 1)[:, None], -normal, normal)  # the hole's outward normal points inwards
        t = mesh.triangles
        edges = torch.cat([t[:, [0, 1]], t[:, [1, 2]], t[:, [2, 0]]])
        edges = torch.cat([edges, edges.flip(1)]).unique(dim=0).T
        for name, value in (("pos", mesh.nodes), ("u", u[..., None]), ("theta", torch.tensor([alpha])),
                            ("triangles", t), ("edge_index", edges), ("boundary_index", boundary),
                            ("boundary_kind", kind), ("boundary_values", datum[segment][:, None]),
                            ("boundary_normal", normal), ("boundary_segment", segment)):
            rows[name].append(value.numpy())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with h5py.File(tmp, "w") as f:
        f.attrs.update({"dataset_name": "heat_annulus", "layout": LAYOUT, "dt": dt, "parameter_names": ["alpha"],
                        "field_names": ["temperature"], "n_trajectories": n_trajectories})
        for name, values in rows.items():
            stacked = np.stack(values)
            f.create_dataset(name, data=stacked.astype(np.float32) if stacked.dtype == np.float64 else stacked)
    os.replace(tmp, path)
    return path


def _node_segment(mesh, nodes: Tensor) -> Tensor:
    """The segment of each boundary node (from the edges it belongs to)."""
    segment = torch.full((len(mesh.nodes),), -1, dtype=torch.long)
    segment[mesh.boundary_edges[:, 0]] = mesh.edge_segment
    segment[mesh.boundary_edges[:, 1]] = mesh.edge_segment
    return segment[nodes]


def _node_data(mesh, datum: Tensor) -> Tensor:
    """Each boundary node's segment datum, zero elsewhere (N,)."""
    value = torch.zeros(len(mesh.nodes), dtype=torch.float64)
    nodes = mesh.boundary_nodes()
    value[nodes] = datum[_node_segment(mesh, nodes)]
    return value


def _initial_field(x: Tensor, modes: int, g: torch.Generator) -> Tensor:
    """A sum of ``modes`` plane waves with random integer wave vectors (up to 3), phases and
    amplitudes, at the nodes ``x`` (N, 2)."""
    k = torch.randint(-3, 4, (modes, 2), generator=g).double()
    phase = 2 * math.pi * torch.rand(modes, generator=g, dtype=torch.float64)
    amplitude = torch.randn(modes, generator=g, dtype=torch.float64) / math.sqrt(modes)
    return (amplitude * torch.cos(math.pi * x @ k.T + phase)).sum(1)


class MeshDataset(torch.utils.data.Dataset):
    """Windows of the trajectories of a mesh dataset file as `MeshSample`s (with their edges).

    Parameters
    ----------
    path : str or Path
        A file in the layout of the module's text.
    n_steps_input, n_steps_output : int
        Frames in and out per window; every start frame of every trajectory gives a window.
    """

    def __init__(self, path: str | Path, n_steps_input: int = 1, n_steps_output: int = 1) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such file")
        with h5py.File(self.path, "r") as f:
            if f.attrs.get("layout") != LAYOUT:
                raise ValueError(f"{self.path}: not a mesh dataset of layout {LAYOUT} (its layout attribute is "
                                 f"{f.attrs.get('layout')!r})")
            missing = [name for name in FIELDS if name not in f]
            if missing:
                raise ValueError(f"{self.path}: missing dataset(s) {missing}")
            self.data = {name: torch.from_numpy(f[name][()]) for name in FIELDS}
            self.dt = float(f.attrs["dt"])
        n, frames = self.data["u"].shape[:2]
        if n_steps_input < 1 or n_steps_output < 1 or n_steps_input + n_steps_output > frames:
            raise ValueError(f"n_steps_input={n_steps_input}, n_steps_output={n_steps_output}: the trajectories "
                             f"of {self.path} have {frames} frames")
        self.t_in, self.t_out = n_steps_input, n_steps_output
        self.starts = frames - n_steps_input - n_steps_output + 1
        self.n_trajectories = n

    def __len__(self) -> int:
        return self.n_trajectories * self.starts

    def __getitem__(self, i: int) -> MeshSample:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i}: the dataset has {len(self)}")
        traj, start = divmod(i, self.starts)
        d = {name: value[traj] for name, value in self.data.items()}
        u = d["u"][start:start + self.t_in + self.t_out].transpose(0, 1)  # (N, T, 1)
        return MeshSample(pos=d["pos"], u_in=u[:, :self.t_in], u_out=u[:, self.t_in:], theta=d["theta"],
                          boundary_index=d["boundary_index"], boundary_kind=d["boundary_kind"],
                          boundary_values=d["boundary_values"], boundary_normal=d["boundary_normal"],
                          boundary_segment=d["boundary_segment"], edge_index=d["edge_index"], dt=self.dt,
                          meta={"file": str(self.path), "trajectory": traj, "start": start})
