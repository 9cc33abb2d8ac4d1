"""PDEBench HDF5 files as a dataset of `PDESample`s, read lazily with h5py.

Supported published layouts (1-D and 2-D):

| layout | datasets | fields |
| --- | --- | --- |
| single tensor | ``tensor`` (N, T, X[, Y]), ``x-coordinate``, [``y-coordinate``], ``t-coordinate`` | one channel |
| CFD | ``density``, ``Vx``, [``Vy``], ``pressure`` each (N, T, X[, Y]) with the coordinates | density, velocity, pressure |
| per seed | groups ``0000``, ``0001``, ... holding ``data`` (T, X[, Y], C) and ``grid/x``, [``grid/y``], ``grid/t`` | C channels |

Parameters come from the root attributes when present, else from the published file-name
pattern (``..._beta0.1``, ``..._Nu0.001``, ``..._M0.1_Eta0.01_Zeta0.01_...``): every
``_<letters><number>`` token of the file name is a parameter. The boundary type of PDEBench's
published files comes from their names (`PUBLISHED_BOUNDARIES`: the conditions PDEBench's
generators impose) unless ``boundary=`` is given. Only the frames of the window asked for are read; each DataLoader worker opens its own
file handle.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from gno_ext.adapters.files import ProcessFiles, open_h5, opening, reading
from gno_ext.adapters.windows import Windows, WindowedTrajectories, check_window_settings, split_trajectories
from torch.utils.data import Dataset

from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch, PDESample

__all__ = ["PDEBenchDataset", "parameters_from_name", "PUBLISHED_BOUNDARIES"]

CFD_FIELDS = ("density", "Vx", "Vy", "Vz", "pressure")
_PARAM = re.compile(r"^([A-Za-z]+)(\d[\d.eE+-]*)$")


def parameters_from_name(name: str) -> dict[str, float]:
    """Parameters encoded in a PDEBench file name, e.g. ``{"m": 0.1, "eta": 0.01, "zeta": 0.01}``."""
    out = {}
    for token in Path(name).stem.split("_"):
        m = _PARAM.match(token)
        if m:
            try:
                out[m.group(1).lower()] = float(m.group(2))
            except ValueError:
                continue
    return out


PUBLISHED_BOUNDARIES: tuple[tuple[str, BCType, str], ...] = (
    (r"^1d_advection_sols_", BCType.PERIODIC, "1-D advection"),
    (r"^1d_burgers_sols_", BCType.PERIODIC, "1-D Burgers"),
    (r"^reacdiff_", BCType.PERIODIC, "1-D diffusion-reaction"),
    (r"^2d_diff-react", BCType.NEUMANN, "2-D diffusion-reaction: no flux through the walls"),
    (r"^2d_rdb", BCType.NEUMANN, "2-D shallow water (radial dam break): zero-gradient extrapolation"),
    (r"_periodic(_|$)", BCType.PERIODIC, "compressible Navier-Stokes, periodic"),
    (r"_trans(_|$)", BCType.OPEN, "compressible Navier-Stokes, transmissive (outgoing)"),
)
"""File-name patterns of PDEBench's published datasets (lower case) and the boundary condition of
every face that PDEBench's generators impose on them. ``1D_diff-sorp`` (a Dirichlet and a
Cauchy face) and the incompressible Navier-Stokes files are not listed: pass ``boundary=``."""


def _boundary_from_name(name: str) -> BCType | None:
    lower = Path(name).stem.lower()
    for pattern, kind, _ in PUBLISHED_BOUNDARIES:
        if re.search(pattern, lower):
            return kind
    return None


LAYOUT = "PDEBench's layout"


class PDEBenchDataset(WindowedTrajectories, Dataset):
    """Windows of one PDEBench file.

    Parameters
    ----------
    path : str or Path
        The HDF5 file.
    n_steps_input, n_steps_output : int
        Frames per window.
    stride : int
        Temporal stride between frames of a window.
    split : {"train", "valid", "test", None}
        With ``split_fractions``, a deterministic split of the trajectories (PDEBench files
        carry no split); None keeps all.
    split_fractions : tuple of float
        Fractions of trajectories for train / valid / test.
    parameters : sequence of str, optional
        Which parameters form ``theta`` and in which order (default: all found, sorted).
    boundary : str or BCType, optional
        Boundary type of every face, when the file name does not say.
    parameter_filter : callable, optional
        ``f(params: dict) -> bool``; a file whose parameters fail yields no samples (OOD splits).
    group : int
        Group id of every sample (one file is one parameter value).
    """

    def __init__(self, path: str | Path, n_steps_input: int = 1, n_steps_output: int = 1, stride: int = 1,
                 split: str | None = None, split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                 parameters: Sequence[str] | None = None, boundary: str | BCType | None = None,
                 parameter_filter: Any = None, group: int = 0) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such PDEBench file")
        check_window_settings(n_steps_input, n_steps_output, stride)
        with opening(self.path, LAYOUT):
            with open_h5(self.path) as f:
                self.layout, self.fields, shape, coords, n_traj, n_frames, attrs = self._inspect(f)
            self.params = {**parameters_from_name(self.path.name), **attrs}
            bad = {k: v for k, v in self.params.items() if not np.isfinite(v)}
            if bad:
                name, value = next(iter(bad.items()))
                raise ValueError(f"{self.path}: parameter {name} = {value} (from the attributes or the file name): "
                                 "not a finite number")
            names = list(parameters) if parameters is not None else sorted(self.params)
            missing = [n for n in names if n not in self.params]
            if missing:
                raise KeyError(f"{self.path.name}: parameter(s) {missing} not found in the attributes or the "
                               f"file name (found: {sorted(self.params)})")
            self.theta = torch.tensor([self.params[n] for n in names], dtype=torch.float32)
            self.parameter_names = names
            kind = BCType.parse(boundary) if boundary is not None else _boundary_from_name(self.path.name)
            if kind is None:
                raise ValueError(f"{self.path.name}: the boundary type is not in the file name, which is not one of "
                                 f"PDEBench's published names; pass boundary='periodic' (or 'open', 'dirichlet', "
                                 f"'neumann')")
            d = len(shape)
            self.bc = BoundarySpec.from_types([kind] * (2 * d))
            names = (["x", "y", "z"] if self.layout == "seed" else ["x-coordinate", "y-coordinate", "z-coordinate"])[:d]
            for axis, (c, n) in enumerate(zip(coords[:d], shape)):
                _check_axis(self.path, names[axis], c, {n}, f"the fields' axis {axis + 1} of {n} cells")
            t = coords[d]
            # PDEBench's 1-D files store one time more than frames (the end time): both are accepted
            _check_axis(self.path, "t-coordinate" if self.layout != "seed" else "grid/t", t, {n_frames, n_frames + 1},
                        f"the {n_frames} frames")
            spacing = [float(c[1] - c[0]) if len(c) > 1 else 1.0 for c in coords[:d]]
            self.grid = Grid(shape, tuple(n * h for n, h in zip(shape, spacing)))
            self.dt = float(t[1] - t[0]) * stride if len(t) > 1 else 1.0
            self.trajectories = split_trajectories(n_traj, split, split_fractions)
            if parameter_filter is not None and not parameter_filter(dict(self.params)):
                self.trajectories = []
            self.windows = Windows([n_frames] * max(len(self.trajectories), 1), n_steps_input, n_steps_output, stride)
            self.group = group
            self._files = ProcessFiles()  # one handle per DataLoader worker

        # ------------------------------------------------------------------ layout detection

    def _inspect(self, f: h5py.File):
        attrs = {k.lower(): float(v) for k, v in f.attrs.items()
                 if np.isscalar(v) and isinstance(v, (int, float, np.integer, np.floating))}
        if "tensor" in f:
            data = f["tensor"]
            shape = tuple(data.shape[2:])
            coords = self._coords(f, len(shape), ("x-coordinate", "y-coordinate"), "t-coordinate")
            return "tensor", ["u"], shape, coords, data.shape[0], data.shape[1], attrs
        fields = [k for k in CFD_FIELDS if k in f]
        if fields:
            shapes = {f[k].shape for k in fields}
            if len(shapes) > 1:
                raise ValueError(f"{self.path.name}: fields {fields} have different shapes {sorted(shapes)}")
            shape = tuple(f[fields[0]].shape[2:])
            coords = self._coords(f, len(shape), ("x-coordinate", "y-coordinate"), "t-coordinate")
            n_traj, n_frames = f[fields[0]].shape[:2]
            return "cfd", fields, shape, coords, n_traj, n_frames, attrs
        seeds = sorted(k for k in f.keys() if k.isdigit())
        if seeds:
            g = f[seeds[0]]
            if "data" not in g:
                raise ValueError(f"{self.path.name}: group {seeds[0]} has no 'data' dataset")
            data = g["data"]
            shape = tuple(data.shape[1:-1])
            axes = [f"grid/{a}" for a in "xyz"[: len(shape)]]
            for ax in axes + ["grid/t"]:
                if ax not in g:
                    raise ValueError(f"{self.path.name}: group {seeds[0]} lacks '{ax}'")
            coords = [g[a][()] for a in axes] + [g["grid/t"][()]]
            self.seeds = seeds
            return "seed", [f"c{i}" for i in range(data.shape[-1])], shape, coords, len(seeds), data.shape[0], attrs
        raise ValueError(f"{self.path.name}: not a known PDEBench layout (expected 'tensor', CFD fields "
                         f"{CFD_FIELDS} or seed groups '0000'...); found keys {sorted(f.keys())[:10]}")

    def _coords(self, f: h5py.File, d: int, spatial: Sequence[str], time: str) -> list[np.ndarray]:
        names = list(spatial[:d]) + [time]
        for n in names:
            if n not in f:
                raise ValueError(f"{self.path.name}: missing dataset '{n}'")
        return [f[n][()] for n in names]

    # ------------------------------------------------------------------ reading
    def _file(self) -> h5py.File:
        return self._files.get(self.path)

    def _frames(self, traj: int, frames: np.ndarray) -> np.ndarray:
        with reading(self.path, LAYOUT):
            f = self._file()
            sel = slice(int(frames[0]), int(frames[-1]) + 1, int(frames[1] - frames[0]) if len(frames) > 1 else 1)
            if self.layout == "tensor":
                arr = f["tensor"][traj, sel][:, None]
            elif self.layout == "cfd":
                arr = np.stack([f[k][traj, sel] for k in self.fields], 1)
            else:
                arr = np.moveaxis(f[self.seeds[traj]]["data"][sel], -1, 1)
            finite = np.isfinite(arr.reshape(arr.shape[0], -1)).all(1)
            if not finite.all():
                bad = int(frames[np.flatnonzero(~finite)[0]])
                raise ValueError(f"{self.path.name}: NaN or Inf in trajectory {traj}, frame {bad}")
            return arr

    def __len__(self) -> int:
        return len(self.windows) if self.trajectories else 0

    def parameter_values(self) -> torch.Tensor:
        """The file's one parameter vector, ``(1, P)`` (`gno_ext.adapters.TrajectoryData`)."""
        return self.theta.reshape(1, -1)

    def trajectory_boundary_kinds(self) -> np.ndarray:
        return np.broadcast_to(self.bc.kind.numpy(), (len(self.windows.lengths), self.bc.kind.shape[-1]))

    def window_boundary_kinds(self) -> np.ndarray:
        return super().window_boundary_kinds()[:len(self)]  # (none where the split holds no trajectory)

    def rollout_indices(self, start: int = 0) -> list[int]:
        return super().rollout_indices(start) if self.trajectories else []

    def trajectory_lengths(self) -> list[int]:
        return super().trajectory_lengths() if self.trajectories else []

    def __getitem__(self, index: int) -> PDESample:
        slot, start = self.windows.locate(index)
        traj = self.trajectories[slot]
        inputs, outputs = self.windows.frames(start)
        arr = torch.from_numpy(np.ascontiguousarray(self._frames(traj, np.concatenate([inputs, outputs]))))
        arr = arr.float()
        n_in = len(inputs)
        return PDESample(u_in=arr[:n_in], u_out=arr[n_in:], theta=self.theta.clone(), bc=self.bc, grid=self.grid,
                         dt=self.dt, group=self.group, meta=self._meta(traj, start))

    def __getitems__(self, indices: list[int]) -> PDEBatch:
        """A whole batch as one `PDEBatch` (what the DataLoader asks for): the windows' frames
        are read as for `__getitem__` and stacked, with no per-sample objects."""
        slots, starts = self.windows.locate_many(np.asarray(indices))
        n_in = self.windows.n_steps_input
        frames = [np.concatenate(self.windows.frames(int(s))) for s in starts]
        trajs = [self.trajectories[int(k)] for k in slots]
        arr = torch.from_numpy(np.stack([self._frames(t, fr) for t, fr in zip(trajs, frames)])).float()
        b = len(indices)
        return PDEBatch(u_in=arr[:, :n_in], u_out=arr[:, n_in:], theta=self.theta.expand(b, -1).clone(),
                        bc=self.bc.expand(b), grid=self.grid, dt=torch.full((b,), self.dt),
                        group=torch.full((b,), self.group, dtype=torch.long),
                        meta=[self._meta(t, int(s)) for t, s in zip(trajs, starts)])

    def _meta(self, traj: int, start: int) -> dict[str, Any]:
        return {"dataset": "pdebench", "file": self.path.name, "trajectory": traj, "start": start,
                "fields": list(self.fields)}


def _check_axis(path: Path, name: str, values: np.ndarray, lengths: set[int], what: str) -> None:
    """A coordinate array: as long as the axis it describes, finite and strictly increasing."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(values) not in lengths:
        raise ValueError(f"{path}: {name} has {len(values)} values, but {what} need "
                         f"{' or '.join(map(str, sorted(lengths)))}")
    steps = np.diff(values)
    if not np.all(np.isfinite(values)) or not np.all(steps > 0):
        first = int(np.flatnonzero(~(np.isfinite(steps) & (steps > 0)))[0]) if len(steps) else 0
        raise ValueError(f"{path}: {name} must increase strictly (finite, positive steps); it does not after "
                         f"entry {first} ({values[first:first + 2].tolist()})")
