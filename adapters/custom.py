"""Your own arrays as a dataset of `PDESample`s.

`ArrayDataset` wraps any array-like with numpy slicing (a numpy array, an ``h5py.Dataset``, a
zarr array, a torch tensor): only the frames of the window asked for are read.

    import h5py
    from gno_ext.adapters import ArrayDataset
    from gno_ext import BoundarySpec, Grid

    f = h5py.File("my_runs.h5", "r")
    ds = ArrayDataset(f["u"], theta=f["alpha"][:, None], grid=Grid((128, 128)), dt=0.01,
                      bc=BoundarySpec.from_types(["dirichlet"] * 4, 1.0))

``open_dataset("custom", path)`` reads the same content from one HDF5 (``.h5``/``.hdf5``) or
``.npz`` file with these names:

| name | shape | meaning |
| --- | --- | --- |
| ``u`` | (N, T, C, *S) | trajectories (required) |
| ``theta`` | (N, P) | scalar parameters (default: none) |
| ``theta_field`` | (N, C_f, *S) | field parameters (optional) |
| ``bc_kind`` | (N, F) or (F,) | `BCType` codes (default: periodic) |
| ``bc_values`` | (N, F, T_bc, N_face) or (F, T_bc, N_face) | boundary data (default: zeros) |
| ``bc_coeffs`` | (N, F, 2) or (F, 2) | Robin coefficients (optional) |
| ``group`` | (N,) | DRO groups (default: 0) |
| ``extent`` (attribute or array) | (d,) | box side lengths (default: unit box) |
| ``dt`` (attribute or array) | () | time between frames (default: 1) |

Boundary data with ``T_bc > 1`` is read as one value per frame of the trajectory (``T_bc = T``);
a window gets the data at its input time and at its output times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from gno_ext.adapters.files import ProcessFiles, open_h5, opening, reading
from gno_ext.adapters.windows import Windows, WindowedTrajectories, window_boundary_values
from torch.utils.data import Dataset

from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch, PDESample

__all__ = ["ArrayDataset", "open_custom"]


class H5Array:
    """An ``h5py.Dataset`` that survives pickling into DataLoader workers (reopened per process)."""

    def __init__(self, dataset: h5py.Dataset) -> None:
        self.filename, self.name = dataset.file.filename, dataset.name
        self.shape, self.ndim = dataset.shape, dataset.ndim
        self._files = ProcessFiles()

    def _dataset(self) -> h5py.Dataset:
        return self._files.get(self.filename)[self.name]

    def __getitem__(self, index: Any) -> np.ndarray:
        return self._dataset()[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._dataset()[()], dtype=dtype)


def _wrap(value: Any) -> Any:
    return H5Array(value) if isinstance(value, h5py.Dataset) else value


LAYOUT = "the custom layout"


def _rows(value: Any, n: int, name: str, per_sample_ndim: int) -> Any:
    """Accept per-dataset (no leading N) or per-trajectory arrays; return a row accessor."""
    if value is None:
        return None
    arr = value if hasattr(value, "shape") else np.asarray(value)
    if arr.ndim == per_sample_ndim:
        return lambda i: np.asarray(arr)
    if arr.ndim == per_sample_ndim + 1 and arr.shape[0] == n:
        return lambda i: np.asarray(arr[i])
    raise ValueError(f"{name}: expected shape (N={n}, ...) with {per_sample_ndim} trailing axes or no N axis, "
                     f"got {tuple(arr.shape)}")


class ArrayDataset(WindowedTrajectories, Dataset):
    """Windows over arrays of trajectories.

    Parameters
    ----------
    u : array-like, shape (N, T, C, *S)
    theta : array-like, shape (N, P), optional
    grid : Grid, optional
        Default: the unit box of ``u``'s spatial shape.
    dt : float
        Time between frames.
    bc : BoundarySpec, optional
        One spec for all trajectories (unbatched) or per trajectory (batched, ``N`` rows).
        Default: periodic.
    theta_field : array-like, shape (N, C_f, *S), optional
    group : array-like, shape (N,), optional
    n_steps_input, n_steps_output, stride : int
        Window shape.
    trajectories : sequence of int, optional
        Subset of trajectories (e.g. a split); default all.
    name : str
        Recorded in ``meta["dataset"]``.
    """

    def __init__(self, u: Any, theta: Any = None, grid: Grid | None = None, dt: float = 1.0,
                 bc: BoundarySpec | None = None, theta_field: Any = None, group: Any = None,
                 n_steps_input: int = 1, n_steps_output: int = 1, stride: int = 1,
                 trajectories: Any = None, name: str = "custom") -> None:
        if not hasattr(u, "shape") or len(u.shape) < 4:
            raise ValueError(f"u: expected an array of shape (N, T, C, *S), got {getattr(u, 'shape', type(u))}")
        n, t = u.shape[:2]
        for key, value in (("u", u), ("theta", theta), ("theta_field", theta_field)):
            if value is not None and np.dtype(getattr(value, "dtype", np.asarray(value).dtype)).kind == "c":
                raise ValueError(f"{name}: {key} holds complex values; the models take real fields (pass the real "
                                 f"and imaginary parts as two channels)")
        if not (np.isfinite(dt) and dt > 0):
            raise ValueError(f"{name}: dt = {dt}: the time between frames must be a finite number above 0")
        if theta is not None:
            values = np.asarray(theta, dtype=np.float64)
            if not np.isfinite(values).all():
                row = np.argwhere(~np.isfinite(values))[0].tolist()
                raise ValueError(f"{name}: theta{row} = {values[tuple(row)]}: the parameters must be finite numbers")
            if values.ndim == 1 and len(values) == n > 1:  # one value per trajectory, or one vector for all?
                raise ValueError(f"{name}: theta of shape ({n},) is ambiguous with {n} trajectories: pass "
                                 f"theta[:, None], shape ({n}, 1), for one parameter per trajectory, or a vector "
                                 f"of {n} parameters shared by every trajectory as shape (1, {n}) tiled to ({n}, {n})")
        u, theta, theta_field, group = _wrap(u), _wrap(theta), _wrap(theta_field), _wrap(group)
        self.u, self.name, self.dt, self.stride = u, name, float(dt), stride
        self.grid = grid or Grid(tuple(u.shape[3:]))
        if tuple(u.shape[3:]) != self.grid.shape:
            raise ValueError(f"u: spatial shape {tuple(u.shape[3:])} does not match grid {self.grid.shape}")
        self.theta = _rows(theta if theta is not None else np.zeros((n, 0), np.float32), n, "theta", 1)
        self.theta_field = _rows(theta_field, n, "theta_field", 1 + self.grid.ndim)
        self.group = _rows(group if group is not None else np.zeros(n, np.int64), n, "group", 0)
        bc = bc if bc is not None else BoundarySpec.periodic(self.grid.ndim)
        bc.check_grid(self.grid)
        if bc.batched and len(bc) != n:
            raise ValueError(f"bc: a batched spec needs {n} rows (one per trajectory), got {len(bc)}")
        if bc.values.shape[-2] not in (1, t):
            raise ValueError(f"bc.values: T_bc must be 1 or the trajectory length {t}, got {bc.values.shape[-2]}")
        self.bc = bc
        self.trajectories = list(range(n)) if trajectories is None else [int(i) for i in trajectories]
        self.windows = Windows([t] * len(self.trajectories), n_steps_input, n_steps_output, stride)

    def parameter_values(self) -> torch.Tensor:
        """The parameters ``(N, P)`` of the trajectories (`gno_ext.adapters.TrajectoryData`)."""
        return torch.as_tensor(np.stack([np.asarray(self.theta(t)).reshape(-1) for t in self.trajectories]),
                               dtype=torch.float32)

    def trajectory_boundary_kinds(self) -> np.ndarray:
        if self.bc.batched:  # one spec per trajectory
            return self.bc.kind[torch.as_tensor(self.trajectories)].numpy()
        return np.broadcast_to(self.bc.kind.numpy(), (len(self.trajectories), self.bc.kind.shape[-1]))

    def __len__(self) -> int:
        return len(self.windows)

    def _bc(self, traj: int, frames: np.ndarray) -> BoundarySpec:
        spec = self.bc[traj] if self.bc.batched else self.bc
        if spec.values.shape[-2] > 1:  # time-dependent data: the last input time and the output times
            values = window_boundary_values(spec.values[None], frames[None], self.windows.n_steps_input)[0]
            spec = BoundarySpec(spec.kind, values, spec.coeffs)
        return spec

    def __getitems__(self, indices: list[int]) -> PDEBatch | list[PDESample]:
        """A whole batch at once (the DataLoader calls this with a batch of indices).

        For arrays held in memory (numpy or torch) the windows are gathered with one fancy
        index and returned as a ready `PDEBatch` (`collate` passes it through); other storage
        falls back to per-sample reads.
        """
        if not isinstance(self.u, (np.ndarray, torch.Tensor)):
            return [self[i] for i in indices]
        with reading(self.name, LAYOUT):
            return self._batch(indices)

    def _batch(self, indices: list[int]) -> PDEBatch:
        slots, starts = self.windows.locate_many(np.asarray(indices))
        traj = np.asarray(self.trajectories)[slots]
        n_in, n_out = self.windows.n_steps_input, self.windows.n_steps_output
        offsets = self.stride * np.arange(n_in + n_out)
        frames = starts[:, None] + offsets
        u = torch.as_tensor(np.asarray(self.u)[traj[:, None], frames], dtype=torch.float32)
        finite = torch.isfinite(u.flatten(2)).all(2)
        if not finite.all():
            b, k = (int(v) for v in torch.nonzero(~finite)[0])
            raise ValueError(f"{self.name}: NaN or Inf in trajectory {traj[b]}, frame {int(frames[b, k])}")
        bc = self.bc[torch.as_tensor(traj)] if self.bc.batched else self.bc.expand(len(indices))
        if bc.values.shape[-2] > 1:
            bc = BoundarySpec(bc.kind, window_boundary_values(bc.values, frames, n_in), bc.coeffs)
        theta = torch.as_tensor(np.stack([np.asarray(self.theta(t)).reshape(-1) for t in traj]), dtype=torch.float32)
        field = None
        if self.theta_field is not None:
            field = torch.as_tensor(np.stack([self.theta_field(t) for t in traj]), dtype=torch.float32)
            bad = ~torch.isfinite(field.flatten(1)).all(1)
            if bad.any():
                raise ValueError(f"{self.name}: NaN or Inf in theta_field of trajectory {traj[int(bad.nonzero()[0])]}")
        return PDEBatch(u_in=u[:, :n_in], u_out=u[:, n_in:], theta=theta, bc=bc, grid=self.grid,
                        dt=torch.full((len(indices),), self.dt * self.stride), theta_field=field,
                        group=torch.as_tensor([int(self.group(t)) for t in traj], dtype=torch.long),
                        meta=[{"dataset": self.name, "trajectory": int(t), "start": int(s)}
                              for t, s in zip(traj, starts)])

    def __getitem__(self, index: int) -> PDESample:
        with reading(self.name, LAYOUT):
            return self._sample(index)

    def _sample(self, index: int) -> PDESample:
        slot, start = self.windows.locate(index)
        traj = self.trajectories[slot]
        inputs, outputs = self.windows.frames(start)
        sel = slice(int(inputs[0]), int(outputs[-1]) + 1, self.stride)
        arr = torch.as_tensor(np.asarray(self.u[traj, sel]), dtype=torch.float32)
        finite = torch.isfinite(arr.flatten(1)).all(1)
        if not finite.all():
            frame = int(inputs[0]) + self.stride * int(torch.nonzero(~finite)[0])
            raise ValueError(f"{self.name}: NaN or Inf in trajectory {traj}, frame {frame}")
        n_in = len(inputs)
        field = None if self.theta_field is None else torch.as_tensor(self.theta_field(traj), dtype=torch.float32)
        if field is not None and not torch.isfinite(field).all():
            raise ValueError(f"{self.name}: NaN or Inf in theta_field of trajectory {traj}")
        return PDESample(u_in=arr[:n_in], u_out=arr[n_in:],
                         theta=torch.as_tensor(self.theta(traj), dtype=torch.float32).reshape(-1),
                         bc=self._bc(traj, np.concatenate([inputs, outputs])), grid=self.grid,
                         dt=self.dt * self.stride, theta_field=field, group=int(self.group(traj)),
                         meta={"dataset": self.name, "trajectory": traj, "start": start})


def open_custom(path: str | Path, n_steps_input: int = 1, n_steps_output: int = 1, **kwargs: Any) -> ArrayDataset:
    """Open an HDF5 or ``.npz`` file with the names of the module docstring as an `ArrayDataset`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix == ".npz":
        try:
            store: Any = _NpzArrays(np.load(path, allow_pickle=False), path)
        except (OSError, ValueError, EOFError) as err:  # zipfile.BadZipFile is an OSError
            detail = "not a zip archive" if "pickle" in str(err) else f"{type(err).__name__}: {err}"
            raise ValueError(f"{path}: not a readable .npz archive of numeric arrays ({detail})") from None
        attrs: dict[str, Any] = {}
    elif path.suffix in (".h5", ".hdf5"):
        store = open_h5(path)
        attrs = dict(store.attrs)
    else:
        raise ValueError(f"{path}: expected an .h5, .hdf5 or .npz file")
    with opening(path, LAYOUT):
        keys = set(store.keys())
        if "u" not in keys:
            raise KeyError(f"{path}: missing the required array 'u' (found: {sorted(keys)})")
        get = lambda k: store[k] if k in keys else None
        scalar = lambda k, default: float(np.asarray(store[k])) if k in keys else float(attrs.get(k, default))
        u = store["u"]
        extent = get("extent") if "extent" in keys else attrs.get("extent")
        grid = Grid(tuple(u.shape[3:]), tuple(np.asarray(extent).tolist()) if extent is not None else ())
        bc = None
        if "bc_kind" in keys:
            codes = np.asarray(store["bc_kind"])
            valid = {int(k) for k in BCType}
            whole = np.issubdtype(codes.dtype, np.integer) or (np.isfinite(codes).all()
                                                                and (codes == np.round(codes)).all())
            if not whole or not set(np.unique(codes).astype(np.int64).tolist()) <= valid:
                bad = next(v for v in codes.reshape(-1).tolist() if not (float(v).is_integer() and int(v) in valid))
                codes_known = ", ".join(f"{int(k)} {k.name}" for k in BCType)
                raise ValueError(f"{path}: bc_kind holds {bad!r}, not a BCType code ({codes_known})")
            kind = torch.as_tensor(codes.astype(np.int64), dtype=torch.long)
            values = get("bc_values")
            values = (torch.as_tensor(np.asarray(values), dtype=torch.float32) if values is not None
                      else torch.zeros(*kind.shape, 1, 1))
            coeffs = get("bc_coeffs")
            bc = BoundarySpec(kind, values, None if coeffs is None else torch.as_tensor(np.asarray(coeffs),
                                                                                        dtype=torch.float32))
        return ArrayDataset(u, theta=get("theta"), grid=grid, dt=scalar("dt", 1.0), bc=bc,
                            theta_field=get("theta_field"), group=get("group"), n_steps_input=n_steps_input,
                            n_steps_output=n_steps_output, name=path.name, **kwargs)


class _NpzArrays:
    """The arrays of an ``.npz`` file, read without unpickling: an array of Python objects is an
    error that names it (numpy's own message suggests ``allow_pickle=True``, which runs code)."""

    def __init__(self, archive: Any, path: Path) -> None:
        self.archive, self.path = archive, path

    def keys(self) -> list[str]:
        return list(self.archive.keys())

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self.archive[key]
        except ValueError as err:
            if "pickle" not in str(err):
                raise
            raise ValueError(f"{self.path}: array {key!r} holds Python objects, which are not read (unpickling can "
                             "run code); store numeric arrays") from None
