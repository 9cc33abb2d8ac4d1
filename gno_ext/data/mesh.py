r"""Heat and advection datasets on irregular domains, written in a documented HDF5 layout, and
their reader into `gno_ext.mesh.MeshSample` windows.

Four domains (``domain=``):

* ``"annulus"``: the disk of radius 1 with a circular hole of radius $r_{in} \sim U[0.2, 0.5]$
  (`gno_ext.solvers.fem.annulus_mesh`); segment 0 is the outer circle, segment 1 the hole's rim;
* ``"star"``: a random smooth shape with a hole, both star-shaped: the outer boundary
  $r(\varphi) = 1 + \sum_{k=2}^{4} a_k \cos(k \varphi + \phi_k)$ with $a_k \sim U[-0.08, 0.08]$,
  the hole $r(\varphi) = r_0 (1 + b \cos(2 \varphi + \psi))$ with $r_0 \sim U[0.2, 0.4]$ and
  $b \sim U[-0.2, 0.2]$ (`gno_ext.solvers.fem.ring_mesh`); segments as for the annulus;
* ``"l-shape"``: the L-shaped domain $[0, 1]^2 \setminus (0.5, 1]^2$
  (`gno_ext.solvers.fem.l_shape_mesh`, the same mesh for every trajectory); segment 0 is the
  outer sides, segment 1 the two edges of the re-entrant corner;
* ``"square"``: the unit square (`gno_ext.solvers.fem.square_mesh`), the domain a grid also
  represents; its four sides are segments 0 to 3 (``x = 0``, ``x = 1``, ``y = 0``, ``y = 1``).

The ring domains have ``resolution`` rings of ``4 * resolution`` sectors, the L-shape
``resolution`` cells per half side and the square ``2 * resolution`` cells per side: every
trajectory of a file has the same node count and connectivity. Each trajectory draws:

* the domain's shape, as above;
* the diffusivity $\alpha$, log-uniform in ``alpha_range`` (the parameter $\theta$);
* a condition per boundary segment: Dirichlet or Neumann with equal probability (on the square,
  whose 16 configurations would leave some out of a small file, trajectory $k$ takes
  configuration $k \bmod 16$ in turn), and its constant datum $g \sim U[-1, 1]$ (the value, or
  the outward flux);
* a smooth random initial field, a sum of ``modes`` random plane waves of wave numbers up to 3,
  set to the Dirichlet data on Dirichlet nodes;

and is solved by P1 finite elements with Crank-Nicolson (`gno_ext.solvers.fem.heat_fem`,
second order, verified), ``substeps`` steps per frame. A node where two segments meet (the
L-shape's corners at (0.5, 1) and (1, 0.5), the square's corners) belongs to the Dirichlet one
where there is one (it is held at that datum), else to the lower-numbered one.

`generate_advection_mesh` writes the advection equation $\partial_t u + v\cdot\nabla u = 0$ on
the same domains. Each trajectory draws a constant velocity $v$ of speed uniform in
``speed_range`` and uniform direction (the parameters $\theta = (v_x, v_y)$), a condition per
segment (Dirichlet with a datum $g \sim U[-1, 1]$, which enters where the flow comes in, or
Neumann: zero normal gradient, datum 0) and the same kind of initial field (not changed at the
boundary: the data matter only on inflow). It is solved by vertex-centred finite volumes
(`gno_ext.solvers.fvm.advection_fvm`, second order, verified) at CFL 0.4.

The files are in the layout that `gno_ext.adapters.mesh` documents and reads (`MeshDataset`),
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from gno_ext._files import written_whole
from gno_ext.adapters.mesh import FIELDS, LAYOUT
from gno_ext.data.fingerprint import StaleDatasetError
from gno_ext.schema import BCType
from gno_ext.solvers.fem import (
    TriangleMesh,
    annulus_mesh,
    heat_fem,
    l_shape_mesh,
    ring_mesh,
    square_mesh,
)
from gno_ext.solvers.fvm import advection_fvm

__all__ = ["DOMAINS", "GRID_FORM_VERSION", "MASK_CHANNELS", "MESH_SIZES", "generate_advection_mesh",
           "generate_heat_mesh", "grid_form", "masked_grid_form", "nodes_from_grid", "prepare_mesh"]

DOMAINS = ("annulus", "star", "l-shape", "square")
SPLITS = ("train", "valid", "test")
# The recipes' sizes: trajectories per domain and split, frames, mesh resolution (nodes: about
# 4 r (r + 1) on the rings, 3 r^2 + 4 r + 1 on the L-shape).
MESH_SIZES = {
    "smoke": {"trajectories": {"train": 4, "valid": 2, "test": 2}, "frames": 5, "resolution": 3},
    "small": {"trajectories": {"train": 64, "valid": 8, "test": 16}, "frames": 11, "resolution": 6},
    "bench": {"trajectories": {"train": 400, "valid": 32, "test": 64}, "frames": 11, "resolution": 8},
    "paper": {"trajectories": {"train": 1000, "valid": 100, "test": 200}, "frames": 21, "resolution": 12},
}


def generate_heat_mesh(path: str | Path, n_trajectories: int, domain: str = "annulus", frames: int = 11,
                       dt: float = 0.02, resolution: int = 6, alpha_range: tuple[float, float] = (0.1, 1.0),
                       modes: int = 4, substeps: int = 4, seed: int = 0) -> Path:
    """Write ``n_trajectories`` heat trajectories on ``domain`` to ``path`` (see the module's text)."""
    _check(domain, n_trajectories, frames, resolution)
    if substeps < 1:
        raise ValueError(f"substeps: expected >= 1, got {substeps}")
    lo, hi = alpha_range
    if not 0 < lo <= hi:
        raise ValueError(f"alpha_range: expected 0 < low <= high, got {alpha_range}")

    def trajectory(mesh: TriangleMesh, g: torch.Generator, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        alpha = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * float(torch.rand((), generator=g)))
        dirichlet_segment = _dirichlet_segments(mesh, g, k)
        datum = 2 * torch.rand(mesh.n_segments, generator=g, dtype=torch.float64) - 1
        node_value = _node_values(mesh, dirichlet_segment, datum)
        u0 = _initial_field(mesh.nodes, modes, g)
        on_dirichlet_edge = dirichlet_segment[mesh.edge_segment]
        fixed = mesh.boundary_edges[on_dirichlet_edge].flatten().unique()
        u0[fixed] = node_value[fixed]
        after = heat_fem(mesh, u0, alpha, dt * (frames - 1), substeps * (frames - 1), on_dirichlet_edge,
                         g_dirichlet=lambda x, t: node_value, g_neumann=lambda x, t: node_value,
                         record_every=substeps)
        return torch.tensor([alpha]), dirichlet_segment, datum, torch.cat([u0[None], after])

    return _write(path, n_trajectories, domain, resolution, seed, trajectory,
                  {"dataset_name": f"heat_{domain}", "dt": dt, "parameter_names": ["alpha"],
                   "solver_version": SOLVER_VERSIONS["heat"],
                   "field_names": ["temperature"]})


def generate_advection_mesh(path: str | Path, n_trajectories: int, domain: str = "annulus", frames: int = 11,
                            dt: float = 0.05, resolution: int = 6, speed_range: tuple[float, float] = (0.5, 1.5),
                            modes: int = 4, seed: int = 0) -> Path:
    """Write ``n_trajectories`` advection trajectories on ``domain`` to ``path`` (see the
    module's text)."""
    _check(domain, n_trajectories, frames, resolution)
    lo, hi = speed_range
    if not 0 < lo <= hi:
        raise ValueError(f"speed_range: expected 0 < low <= high, got {speed_range}")

    def trajectory(mesh: TriangleMesh, g: torch.Generator, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        speed = lo + (hi - lo) * float(torch.rand((), generator=g))
        angle = 2 * math.pi * float(torch.rand((), generator=g))
        velocity = torch.tensor([speed * math.cos(angle), speed * math.sin(angle)], dtype=torch.float64)
        dirichlet_segment = _dirichlet_segments(mesh, g, k)
        datum = torch.where(dirichlet_segment, 2 * torch.rand(mesh.n_segments, generator=g, dtype=torch.float64) - 1, 0.0)
        node_value = _node_values(mesh, dirichlet_segment, datum)
        u0 = _initial_field(mesh.nodes, modes, g)
        times = dt * torch.arange(frames, dtype=torch.float64)
        u = advection_fvm(mesh, u0, velocity, times, dirichlet_segment[mesh.edge_segment],
                          g_dirichlet=lambda x, t: node_value)
        return velocity, dirichlet_segment, datum, u

    return _write(path, n_trajectories, domain, resolution, seed, trajectory,
                  {"dataset_name": f"advection_{domain}", "dt": dt, "parameter_names": ["vx", "vy"],
                   "solver_version": SOLVER_VERSIONS["advection"],
                   "field_names": ["concentration"]})


GENERATORS = {"heat": generate_heat_mesh, "advection": generate_advection_mesh}
# The version of each equation's trajectories, written to every file (``solver_version``): a
# change of the solver that changes the trajectories raises it, and a cached file of another
# version is refused (`prepare_mesh`). A file without the attribute is version 1.
# advection 2: the first-order reconstruction at Neumann inflow nodes (version 1 grew without
# bound on some trajectories, `gno_ext.solvers.fvm`).
SOLVER_VERSIONS = {"heat": 1, "advection": 2}
# The layout of the grid files `grid_form` and `masked_grid_form` write, in their attribute
# ``grid_form_version``: raised when they write other arrays, so that a grid file kept from an
# earlier layout (benchmarks/compare_square.py keeps a current one) is written again.
GRID_FORM_VERSION = 1


def prepare_mesh(folder: str | Path, pde: str, domains: list[str] | tuple[str, ...], size: str,
                 seed: int = 0) -> None:
    """Write the files ``folder/<pde>-<domain>/<split>.h5`` of ``size`` (`MESH_SIZES`) that are
    missing; each file's trajectories come from a seed of their own (domain, split, ``seed``), so a
    domain's files are the same whichever other domains are listed with it."""
    if pde not in GENERATORS:
        raise ValueError(f"data.pde: expected one of {', '.join(GENERATORS)}, got {pde!r}")
    if size not in MESH_SIZES:
        raise ValueError(f"size: expected one of {', '.join(MESH_SIZES)}, got {size!r}")
    plan = MESH_SIZES[size]
    for domain in domains:
        if domain not in DOMAINS:
            raise ValueError(f"data.domains: expected some of {', '.join(DOMAINS)}, got {domain!r}")
    for domain in domains:
        for k, split in enumerate(SPLITS):
            path = Path(folder) / f"{pde}-{domain}" / f"{split}.h5"
            if path.is_file():
                _check_version(path, pde)
            else:  # the stream is the domain's own: its file is the same in any list
                GENERATORS[pde](path, plan["trajectories"][split], domain, frames=plan["frames"],
                                resolution=plan["resolution"], seed=1000 * seed + 10 * DOMAINS.index(domain) + k)


def _check_version(path: Path, pde: str) -> None:
    """Raise `StaleDatasetError` if the cached file ``path`` holds trajectories of another solver
    version than today's (`SOLVER_VERSIONS`)."""
    with h5py.File(path, "r") as f:
        found = int(f.attrs.get("solver_version", 1))
    if found != SOLVER_VERSIONS[pde]:
        raise StaleDatasetError(
            f"{path}: its {pde} trajectories were made by solver version {found}, today's is {SOLVER_VERSIONS[pde]} "
            f"(a change of the solver changed them), so the file is not used. Regenerate it: move or remove the "
            f"folder {path.parent}, and the next run writes it anew.")


def grid_form(folder: str | Path, out: str | Path) -> list[int]:
    """Write the square-domain files ``folder/{train,valid,test}.h5`` as one grid file ``out``
    (the layout of `gno_ext.adapters.custom`), for a grid model to train on the same
    trajectories as a mesh model. Returns the splits' trajectory counts, for
    ``data.split_fractions`` (the custom recipe reads the file's trajectories in consecutive
    blocks: train, then valid, then test).

    The square's ``(n + 1)^2`` nodes become the cells of an ``(n + 1) x (n + 1)`` grid of the
    same spacing ``1 / n`` (axis 0 along x; its cell centres lie half a spacing from the nodes),
    its sides the grid's faces ``x-, x+, y-, y+`` with the side's type and datum (constant along
    the face and in time); ``theta``, ``dt`` and the parameter names are kept. The file is written
    to a temporary name and renamed when complete."""
    folder, out = Path(folder), Path(out)
    parts: dict[str, list[np.ndarray]] = {"u": [], "theta": [], "bc_kind": [], "bc_values": []}
    counts, attrs = [], {}
    for split in SPLITS:
        path = folder / f"{split}.h5"
        data, attrs = _read_split(path, "grid_form reads a square domain's", ("pos", "u", "theta", "boundary_segment",
                                                                             "boundary_kind", "boundary_values"), "square")
        pos, u, segment, kind = data["pos"], data["u"], data["boundary_segment"], data["boundary_kind"]
        values = data["boundary_values"][..., 0]
        parts["theta"].append(data["theta"])
        n_traj, n_frames, n_nodes, _ = u.shape
        side = math.isqrt(n_nodes)
        cells = side - 1
        ij = np.rint(pos * cells).astype(np.int64)
        if side * side != n_nodes or np.abs(pos * cells - ij).max() > 1e-4:
            raise ValueError(f"{path}: the nodes are not the {side} x {side} points of square_mesh")
        grid = np.zeros((n_traj, n_frames, 1, side, side), dtype=np.float32)
        rows = np.arange(n_traj)[:, None]
        grid[rows, :, 0, ij[..., 0], ij[..., 1]] = u[..., 0].transpose(0, 2, 1)
        parts["u"].append(grid)
        face_kind = np.zeros((n_traj, 4), dtype=np.int64)
        face_value = np.zeros((n_traj, 4, 1, 1), dtype=np.float32)
        for s in range(4):  # a side's nodes share its type and datum (a corner may belong to the other side)
            if not (segment == s).any(1).all():
                raise ValueError(f"{path}: a trajectory has no node on side {s}")
            first = np.argmax(segment == s, axis=1)
            face_kind[:, s] = kind[rows[:, 0], first]
            face_value[:, s, 0, 0] = values[rows[:, 0], first]
        parts["bc_kind"].append(face_kind)
        parts["bc_values"].append(face_value)
        counts.append(n_traj)
    with _h5_written(out) as f:
        for name, arrays in parts.items():
            f.create_dataset(name, data=np.concatenate(arrays))
        f.attrs.update({**attrs, "extent": [side / cells] * 2, "split_counts": counts, "source": str(folder),
                        "grid_form_version": GRID_FORM_VERSION})
    return counts


def _read_split(path: Path, reader: str, names: tuple[str, ...], domain: str | None = None) -> tuple[dict, dict]:
    """The arrays ``names`` of the mesh file ``path`` (of ``domain``, where given) and its ``dt``
    and parameter names; a missing file or another layout is named, with what ``reader`` (``"X
    reads ...'s"``) expected."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file ({reader} train, valid and test files)")
    with h5py.File(path, "r") as f:
        if f.attrs.get("layout") != LAYOUT or (domain is not None and f.attrs.get("domain") != domain):
            raise ValueError(f"{path}: expected a {LAYOUT} file" + (f" of the {domain} domain" if domain else "")
                             + f", got layout {f.attrs.get('layout')!r}"
                             + (f", domain {f.attrs.get('domain')!r}" if domain else ""))
        return ({k: f[k][...] for k in names},
                {"dt": float(f.attrs["dt"]), "parameter_names": list(f.attrs["parameter_names"])})


MASK_CHANNELS = ("inside", "dirichlet", "neumann", "datum")
"""The field parameters (``theta_field``) of `masked_grid_form`'s file, one channel each: 1 on
the cells inside the domain; 1 on the boundary cells of a Dirichlet segment; 1 on those of a
Neumann segment; the segment's datum on its boundary cells (0 elsewhere)."""


def _locate(points: np.ndarray, pos: np.ndarray, triangles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``points`` (P, 2), the triangle of the mesh (``pos``, ``triangles``) that holds
    it (-1: none) and its barycentric coordinates there, shapes (P,) and (P, 3)."""
    a, b, c = (pos[triangles[:, k]] for k in range(3))
    e1, e2 = b - a, c - a
    det = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]  # (T,): twice the signed area
    d = points[:, None, :] - a[None]  # (P, T, 2)
    l1 = (d[..., 0] * e2[:, 1] - d[..., 1] * e2[:, 0]) / det
    l2 = (e1[:, 0] * d[..., 1] - e1[:, 1] * d[..., 0]) / det
    bary = np.stack([1 - l1 - l2, l1, l2], -1)  # (P, T, 3)
    holds = (bary >= -1e-9).all(-1)
    tri = np.where(holds.any(1), holds.argmax(1), -1)
    return tri, bary[np.arange(len(points)), np.maximum(tri, 0)]


def _grid_to_node_weights(pos: np.ndarray, lo: np.ndarray, h: float, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear interpolation from the cell centres of a ``side x side`` grid (cell ``(i, j)``
    centred at ``lo + (i + 1/2, j + 1/2) h``) to the nodes ``pos`` (N, 2), using cells inside
    the domain alone (``inside``, (side, side)): the four cells around a node, their weights
    renormalised over those inside; the nearest inside cell where none of the four is. Returns
    the flat cell indices and weights, each (N, 4)."""
    side = inside.shape[0]
    f = (pos - lo) / h - 0.5
    i0 = np.floor(f).astype(np.int64)
    t = f - i0
    cells, weights = [], []
    for di, dj in ((0, 0), (1, 0), (0, 1), (1, 1)):
        i, j = np.clip(i0[:, 0] + di, 0, side - 1), np.clip(i0[:, 1] + dj, 0, side - 1)
        w = (t[:, 0] if di else 1 - t[:, 0]) * (t[:, 1] if dj else 1 - t[:, 1])
        cells.append(i * side + j)
        weights.append(w * inside[i, j])
    cells, weights = np.stack(cells, 1), np.stack(weights, 1)
    total = weights.sum(1, keepdims=True)
    lone = total[:, 0] <= 1e-12
    if lone.any():  # no inside cell among the four: the nearest inside cell
        inner = np.argwhere(inside)
        near = np.argmin(((pos[lone, None, :] - (lo + (inner + 0.5) * h)[None]) ** 2).sum(-1), 1)
        ij = inner[near]
        cells[lone] = (ij[:, 0] * side + ij[:, 1])[:, None]
        weights[lone], total[lone] = np.array([1.0, 0.0, 0.0, 0.0]), 1.0
    return cells, (weights / total).astype(np.float32)


def nodes_from_grid(values: Tensor | np.ndarray, node_cells: Tensor | np.ndarray,
                    node_weights: Tensor | np.ndarray) -> Tensor:
    """The values at a mesh's nodes of fields on `masked_grid_form`'s grid: ``values`` (B, ...,
    side, side) and the file's ``node_cells``, ``node_weights`` of the same trajectories (B,
    nodes, 4); returns (B, ..., nodes)."""
    values, cells, weights = (torch.as_tensor(v) for v in (values, node_cells, node_weights))
    flat = values.flatten(-2)  # (B, ..., side * side)
    lead = flat.shape[1:-1]
    index = cells.reshape(cells.shape[0], *[1] * len(lead), -1).expand(-1, *lead, -1)  # (B, ..., nodes * 4)
    picked = flat.gather(-1, index).unflatten(-1, cells.shape[1:])  # (B, ..., nodes, 4)
    return (picked * weights.view(weights.shape[0], *[1] * len(lead), *weights.shape[1:]).to(picked.dtype)).sum(-1)


def masked_grid_form(folders: list[str | Path] | tuple[str | Path, ...], out: str | Path,
                     side: int | None = None) -> list[int]:
    """Write the mesh trajectories of ``folders`` (each a domain's ``{train,valid,test}.h5``)
    on a grid, as one file ``out`` of `gno_ext.adapters.custom`'s layout, for a grid model to
    train on the same trajectories as a mesh model where the domain is not a square. Returns
    the splits' trajectory counts (train, valid, test; each split's trajectories are the
    folders' in their order), for ``data.split_fractions``.

    Each trajectory's bounding square (the larger side of its nodes' bounding box) is divided
    into ``side - 2`` cells a side, with one more cell around it, outside the domain: a
    ``side x side`` grid whose axis 0 is along x. The file gives the grid the unit square as its
    extent: every trajectory's square is scaled to it, so the cell size differs between domains of
    different sizes (the inside mask tells them apart). A cell whose centre lies in a triangle of the
    mesh is inside the domain and takes the P1 interpolant of each frame there; a cell outside
    holds 0, so the grid's four faces are Dirichlet with datum 0. The boundary conditions reach
    a grid model as field parameters (``theta_field``, `MASK_CHANNELS`): the inside mask, and on
    each boundary cell (an inside cell with an outside neighbour) the type and datum of the
    segment of the boundary node nearest to it. ``group`` numbers each trajectory's pair (or
    tuple) of segment types. ``node_cells`` and ``node_weights`` (trajectories, nodes, 4) give
    the bilinear interpolation back to the nodes from the inside cells (`nodes_from_grid`), by
    which a grid model's rollout is compared with the mesh's own values; where the domains'
    node counts differ they are padded to the largest, and ``node_count`` gives each
    trajectory's own. ``side`` defaults to three times the square root of the first file's node
    count, rounded up to an even number: the nodes' values carried to the grid and back then
    differ from themselves by about 1 % of their variance (nMSE) on the `small` rings."""
    folders, out = [Path(f) for f in folders], Path(out)
    if not folders:
        raise ValueError("masked_grid_form: name at least one mesh folder")
    if side is not None and (isinstance(side, bool) or not isinstance(side, int) or side < 3):
        raise ValueError(f"side: an integer >= 3 expected (the domain's cells and one around them), got {side!r}")
    names = ("u", "theta", "theta_field", "bc_kind", "bc_values", "configuration", "node_cells", "node_weights")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
    counts, attrs = [], {}
    for split in SPLITS:
        n_split = 0
        for folder in folders:
            path = folder / f"{split}.h5"
            data, here = _read_split(path, "masked_grid_form reads each folder's",
                                     ("pos", "triangles", "u", "theta", "boundary_index", "boundary_kind",
                                      "boundary_segment", "boundary_values"))
            if attrs and here != attrs:
                raise ValueError(f"{path}: dt and parameters {here} differ from the other files' {attrs}")
            attrs = here
            if data["u"].shape[-1] != 1:
                raise ValueError(f"{path}: masked_grid_form writes one-channel fields, got {data['u'].shape[-1]}")
            if side is None:
                side = 3 * math.ceil(math.sqrt(data["pos"].shape[1]))
                side += side % 2
            _masked_trajectories(path, data, side, parts)
            n_split += len(data["u"])
        counts.append(n_split)
    configurations, groups = np.unique(np.concatenate(parts.pop("configuration")), axis=0, return_inverse=True)
    parts["node_count"] = [a.shape[0] * [a.shape[1]] for a in parts["node_cells"]]
    most = max(a.shape[1] for a in parts["node_cells"])  # domains of fewer nodes: padded with weight 0
    for name in ("node_cells", "node_weights"):
        parts[name] = [np.pad(a, ((0, 0), (0, most - a.shape[1]), (0, 0))) for a in parts[name]]
    with _h5_written(out) as f:
        for name, arrays in parts.items():
            f.create_dataset(name, data=np.concatenate(arrays))
        f.create_dataset("group", data=groups.reshape(-1).astype(np.int64))
        f.attrs.update({**attrs, "extent": [1.0, 1.0], "split_counts": counts, "side": side,
                        "theta_field_names": list(MASK_CHANNELS), "configurations": configurations.tolist(),
                        "source": [str(f) for f in folders], "grid_form_version": GRID_FORM_VERSION})
    return counts


def _masked_trajectories(path: Path, data: dict[str, np.ndarray], side: int, parts: dict[str, list]) -> None:
    """`masked_grid_form`'s arrays of one file's trajectories, appended to ``parts``."""
    n_traj, n_frames = data["u"].shape[:2]
    grid = np.zeros((n_traj, n_frames, 1, side, side), dtype=np.float32)
    fields = np.zeros((n_traj, len(MASK_CHANNELS), side, side), dtype=np.float32)
    node_cells = np.zeros((n_traj, data["pos"].shape[1], 4), dtype=np.int64)
    node_weights = np.zeros((n_traj, data["pos"].shape[1], 4), dtype=np.float32)
    configuration = np.zeros((n_traj, int(data["boundary_segment"].max()) + 1), dtype=np.int64)
    for n in range(n_traj):
        pos, triangles = data["pos"][n].astype(np.float64), data["triangles"][n]
        lo = pos.min(0)
        h = float((pos.max(0) - lo).max()) / (side - 2)
        lo = lo - h  # one cell around the domain's bounding square
        ij = np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="ij"), -1).reshape(-1, 2)
        tri, bary = _locate(lo + (ij + 0.5) * h, pos, triangles)
        inside = (tri >= 0).reshape(side, side)
        if not inside.any():
            raise ValueError(f"{path}: trajectory {n} has no cell inside its domain on a {side} x {side} grid")
        corners = triangles[np.maximum(tri, 0)]  # (cells, 3)
        values = (data["u"][n][:, corners, 0] * bary[None]).sum(-1)  # (frames, cells)
        grid[n, :, 0] = np.where(inside.reshape(-1), values, 0.0).reshape(n_frames, side, side)
        padded = np.pad(inside, 1)
        edge = inside & ~(padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:])
        cells = np.argwhere(edge)
        rim = pos[data["boundary_index"][n]]
        nearest = np.argmin((((lo + (cells + 0.5) * h)[:, None, :] - rim[None]) ** 2).sum(-1), 1)
        kind = data["boundary_kind"][n][nearest]
        unknown = set(kind.tolist()) - {int(BCType.DIRICHLET), int(BCType.NEUMANN)}
        if unknown:
            raise ValueError(f"{path}: trajectory {n} has boundary types {sorted(unknown)}; masked_grid_form "
                             f"writes Dirichlet and Neumann segments")
        fields[n, 0] = inside
        fields[n, 1][cells[:, 0], cells[:, 1]] = kind == int(BCType.DIRICHLET)
        fields[n, 2][cells[:, 0], cells[:, 1]] = kind == int(BCType.NEUMANN)
        fields[n, 3][cells[:, 0], cells[:, 1]] = data["boundary_values"][n][nearest, 0]
        node_cells[n], node_weights[n] = _grid_to_node_weights(pos, lo, h, inside)
        for s in range(configuration.shape[1]):
            configuration[n, s] = data["boundary_kind"][n][np.argmax(data["boundary_segment"][n] == s)]
    parts["u"].append(grid)
    parts["theta"].append(data["theta"].astype(np.float32))
    parts["theta_field"].append(fields)
    parts["bc_kind"].append(np.full((n_traj, 4), int(BCType.DIRICHLET), dtype=np.int64))
    parts["bc_values"].append(np.zeros((n_traj, 4, 1, 1), dtype=np.float32))
    parts["configuration"].append(configuration)
    parts["node_cells"].append(node_cells)
    parts["node_weights"].append(node_weights)


def _check(domain: str, n_trajectories: int, frames: int, resolution: int) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"domain: expected one of {', '.join(DOMAINS)}, got {domain!r}")
    if n_trajectories < 1 or frames < 2 or resolution < 1:
        raise ValueError(f"n_trajectories >= 1, frames >= 2 and resolution >= 1 expected, got "
                         f"{n_trajectories}, {frames}, {resolution}")


def _dirichlet_segments(mesh: TriangleMesh, g: torch.Generator, k: int) -> Tensor:
    """Which segments of trajectory ``k`` are Dirichlet: each with probability 1/2 on the
    two-segment domains; on the square (four sides, 16 configurations) configuration ``k mod 16``
    (side ``s`` Dirichlet where bit ``s`` of it is 0), so that a file of 16 or more trajectories
    has every one, and a shorter file's are among a longer one's."""
    n = mesh.n_segments
    if n == 2:
        return torch.rand(2, generator=g) < 0.5
    return (((k % 2**n) >> torch.arange(n)) & 1) == 0


def _node_values(mesh: TriangleMesh, dirichlet_segment: Tensor, datum: Tensor) -> Tensor:
    """Each boundary node's datum (that of its segment, `_node_segment`), zero inside, (N,)."""
    boundary = mesh.boundary_nodes()
    value = torch.zeros(len(mesh.nodes), dtype=torch.float64)
    value[boundary] = datum[_node_segment(mesh, boundary, dirichlet_segment)]
    return value


def _write(path: str | Path, n_trajectories: int, domain: str, resolution: int, seed: int,
           trajectory: Callable[[TriangleMesh, torch.Generator, int], tuple[Tensor, Tensor, Tensor, Tensor]],
           attrs: dict) -> Path:
    """Draw and solve every trajectory (``trajectory(mesh, g, k) -> (theta, Dirichlet segments,
    data per segment, frames (T, N))``) and write the file, under a temporary name until complete."""
    g = torch.Generator().manual_seed(seed)
    rows: dict[str, list[np.ndarray]] = {name: [] for name in FIELDS}
    for k in range(n_trajectories):
        mesh = _domain(domain, resolution, g)
        theta, dirichlet_segment, datum, u = trajectory(mesh, g, k)
        boundary = mesh.boundary_nodes()
        segment = _node_segment(mesh, boundary, dirichlet_segment)
        kind = torch.where(dirichlet_segment[segment], int(BCType.DIRICHLET), int(BCType.NEUMANN))
        edges = mesh.directed_edges()
        edges = torch.cat([edges, edges.flip(1)]).unique(dim=0).T
        for name, value in (("pos", mesh.nodes), ("u", u[..., None]), ("theta", theta),
                            ("triangles", mesh.triangles), ("edge_index", edges), ("boundary_index", boundary),
                            ("boundary_kind", kind), ("boundary_values", datum[segment][:, None]),
                            ("boundary_normal", mesh.boundary_normals(boundary)), ("boundary_segment", segment)):
            rows[name].append(value.numpy())
    path = Path(path)
    with _h5_written(path) as f:
        f.attrs.update({**attrs, "domain": domain, "layout": LAYOUT, "n_trajectories": n_trajectories})
        for name, values in rows.items():
            stacked = np.stack(values)
            f.create_dataset(name, data=stacked.astype(np.float32) if stacked.dtype == np.float64 else stacked)
    return path


@contextlib.contextmanager
def _h5_written(path: Path) -> Iterator[h5py.File]:
    """An HDF5 file to fill, written under a temporary name and renamed to ``path`` when the
    block ends without an error; a write that fails leaves nothing."""
    with written_whole(path) as tmp, h5py.File(tmp, "w") as f:
        yield f


def _domain(domain: str, resolution: int, g: torch.Generator) -> TriangleMesh:
    """One trajectory's mesh of ``domain``, its shape drawn from ``g`` (see the module's text)."""
    if domain == "annulus":
        return annulus_mesh(0.2 + 0.3 * float(torch.rand((), generator=g)), 1.0, resolution, 4 * resolution)
    if domain == "star":
        a = 0.16 * torch.rand(3, generator=g, dtype=torch.float64) - 0.08
        phase = 2 * math.pi * torch.rand(3, generator=g, dtype=torch.float64)
        r0 = 0.2 + 0.2 * float(torch.rand((), generator=g))
        b = 0.4 * float(torch.rand((), generator=g)) - 0.2
        psi = 2 * math.pi * float(torch.rand((), generator=g))
        k = torch.arange(2, 5, dtype=torch.float64)
        outer = lambda angle: 1 + (a * torch.cos(k * angle[:, None] + phase)).sum(1)
        inner = lambda angle: r0 * (1 + b * torch.cos(2 * angle + psi))
        return ring_mesh(inner, outer, resolution, 4 * resolution)
    if domain == "square":
        return square_mesh(2 * resolution)
    return l_shape_mesh(resolution)


def _node_segment(mesh: TriangleMesh, nodes: Tensor, dirichlet_segment: Tensor) -> Tensor:
    """The segment of each boundary node: of its edges' segments, a Dirichlet one where there is
    one, else the lowest."""
    n_segments = len(dirichlet_segment)
    # rank each segment: Dirichlet ones first, then by number
    rank = torch.arange(n_segments) + n_segments * (~dirichlet_segment).long()
    best = torch.full((len(mesh.nodes),), 2 * n_segments, dtype=torch.long)
    edge_rank = rank[mesh.edge_segment]
    for end in (0, 1):
        best.scatter_reduce_(0, mesh.boundary_edges[:, end], edge_rank, reduce="amin")
    return (best[nodes] % n_segments)


def _initial_field(x: Tensor, modes: int, g: torch.Generator) -> Tensor:
    """A sum of ``modes`` plane waves with random integer wave vectors (up to 3), phases and
    amplitudes, at the nodes ``x`` (N, 2)."""
    k = torch.randint(-3, 4, (modes, 2), generator=g).double()
    phase = 2 * math.pi * torch.rand(modes, generator=g, dtype=torch.float64)
    amplitude = torch.randn(modes, generator=g, dtype=torch.float64) / math.sqrt(modes)
    return (amplitude * torch.cos(math.pi * x @ k.T + phase)).sum(1)
