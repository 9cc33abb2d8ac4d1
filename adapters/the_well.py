"""The Well datasets as `PDESample`s, through the ``the_well`` package's own reader.

| The Well (``WellDataset`` sample) | schema |
| --- | --- |
| ``input_fields`` (T_in, *S, C), ``output_fields`` | ``u_in``, ``u_out`` (T, C, *S); vector and tensor components are channels, named in ``meta["fields"]`` |
| constant scalars (e.g. ``tcool``) | ``theta`` (P,), in ``metadata.constant_scalar_names`` order |
| ``constant_fields`` | ``theta_field`` (C_f, *S) |
| ``boundary_conditions`` (d, 2): WALL / OPEN / PERIODIC per axis side | ``BoundarySpec.kind`` (faces x-, x+, y-, y+, ...) with BCType WALL / OPEN / PERIODIC, zero data |
| ``input_time_grid``, ``output_time_grid`` | ``dt`` |
| ``dimensions`` coordinates | ``Grid`` extents |
| the file's constant-scalar values | ``group`` (index of the distinct parameter value) |

``path`` is The Well's base path (the folder holding ``datasets/``, with ``name=``) or a split
folder (``.../datasets/NAME/data/train``). Requires the optional ``the_well`` package.

``reader="h5py"`` reads the fields of each window straight from the files (The Well's published
layout, cached file handles) after ``WellDataset`` has indexed them and given the metadata and
boundary codes; it yields the same samples (tested against ``WellDataset``) several times faster,
because ``WellDataset`` re-opens the file and re-reads its attributes for every sample. It does
not apply ``normalize`` (use the default reader for that).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from gno_ext.adapters.files import ProcessFiles, check_one_grid, grid_of, open_h5, opening, reading
from gno_ext.adapters.windows import check_start, check_window_settings
from gno_ext.schema import BCType, BoundarySpec, Grid, PDEBatch, PDESample

__all__ = ["WellAdapter", "WELL_BC"]

WELL_BC = {0: BCType.WALL, 1: BCType.OPEN, 2: BCType.PERIODIC}  # the_well.data.datasets.BoundaryCondition


LAYOUT = "The Well's layout"


def _split_folder(path: Path, name: str | None, split: str) -> Path:
    if (path / "datasets").is_dir():
        if name is None:
            found = sorted(p.name for p in (path / "datasets").iterdir() if p.is_dir())
            raise ValueError(f"{path}: a Well base path needs name= (datasets here: {found})")
        path = path / "datasets" / name / "data" / split
    elif (path / "data" / split).is_dir():
        path = path / "data" / split
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such Well split folder")
    if not any(path.glob("*.hdf5")) and not any(path.glob("*.h5")):
        raise FileNotFoundError(f"{path}: the split folder holds no HDF5 file")
    return path


class WellAdapter(Dataset):
    """Windows of a Well dataset split, mapped to the schema.

    Parameters
    ----------
    path : str or Path
        Well base path (with ``name``) or a split folder.
    n_steps_input, n_steps_output : int
        Frames per window.
    split : {"train", "valid", "test"}
    name : str, optional
        Dataset name under ``datasets/`` (e.g. ``"turbulent_radiative_layer_2D"``).
    stride : int
        Temporal stride between frames.
    normalize : bool
        Normalise fields with the dataset's ``stats.yaml`` (``WellDataset(use_normalization=True)``).
    parameter_filter : callable, optional
        ``f(params: dict) -> bool`` on a file's constant scalars; files that fail are skipped
        (for OOD experiments).
    reader : {"the_well", "h5py"}
        Who reads the fields of a window: ``WellDataset`` itself, or the direct reader (see
        the module docstring).
    **well_kwargs
        Passed to ``WellDataset``.
    """

    def __init__(self, path: str | Path, n_steps_input: int = 1, n_steps_output: int = 1, split: str = "train",
                 name: str | None = None, stride: int = 1, normalize: bool = False,
                 parameter_filter: Callable[[dict], bool] | None = None, reader: str = "the_well",
                 **well_kwargs: Any) -> None:
        from the_well.data import WellDataset

        check_window_settings(n_steps_input, n_steps_output, stride)
        if reader not in ("the_well", "h5py"):
            raise ValueError(f"reader: expected 'the_well' or 'h5py', got {reader!r}")
        if reader == "h5py" and normalize:
            raise ValueError("normalize=True needs reader='the_well' (the direct reader returns raw fields)")
        self.reader, self.stride = reader, stride

        self.folder = folder = _split_folder(Path(path), name, split)
        files = sorted(list(folder.glob("*.hdf5")) + list(folder.glob("*.h5")))
        if not files:
            raise FileNotFoundError(f"{folder}: no .hdf5 or .h5 file")
        checked = [check_well_file(f) for f in files]  # every field's shape against the file's axes
        params = [scalars for scalars, _ in checked]
        check_one_grid(files, [grid for _, grid in checked])  # (before The Well's own assertion on it)
        for f, p in zip(files, params):
            missing = sorted(set().union(*params) - set(p))
            if missing:
                raise ValueError(f"{f}: has no constant scalar {missing[0]!r}, which other files of {folder} have")
        include = [f.name for f, p in zip(files, params) if parameter_filter is None or parameter_filter(p)]
        if not include:
            raise ValueError(f"{folder}: parameter_filter kept no file")
        with opening(folder, LAYOUT):  # The Well's reader meets every file's structure
            self.well = WellDataset(path=str(folder), n_steps_input=n_steps_input, n_steps_output=n_steps_output,
                                    use_normalization=normalize, normalize_time_grid=False, min_dt_stride=stride,
                                    max_dt_stride=stride, include_filters=include if parameter_filter else [],
                                    **well_kwargs)
            kept = {Path(p).name for p in self.well.files_paths}
            if parameter_filter is not None and kept != set(include):
                # WellDataset filters by substring: a kept name inside another name pulls that file in too
                raise ValueError(f"{folder}: file names overlap ({sorted(kept - set(include))} matched the filter too); "
                                 f"select files with the split folder instead")
            meta = self.well.metadata
            self.metadata = meta
            self.parameter_names = list(meta.constant_scalar_names)
            self.field_names = [n for order in sorted(meta.field_names) for n in meta.field_names[order]]
            values = sorted({tuple(p.get(k, np.nan) for k in self.parameter_names) for p in params})
            self._groups = {v: i for i, v in enumerate(values)}
            self.grid = Grid(tuple(meta.spatial_resolution), checked[0][1][1])
            self._files = ProcessFiles()
            if reader == "h5py":  # what does not change from window to window, once
                first = self.well[0]
                self._codes = first["boundary_conditions"].long().flatten().tolist()
                self._scalars = {Path(f).name: p for f, p in zip(files, params)}

    def __len__(self) -> int:
        return len(self.well)

    def parameter_values(self) -> Tensor:
        """One row per distinct parameter vector of the files, ``(G, P)``
        (`gno_ext.adapters.TrajectoryData`)."""
        return torch.tensor(sorted(self._groups), dtype=torch.float32).reshape(len(self._groups), -1)

    def window_boundary_kinds(self) -> np.ndarray:
        kind = self[0].bc.kind.numpy()  # one boundary configuration per dataset
        return np.broadcast_to(kind, (len(self), kind.shape[-1]))

    def rollout_indices(self, start: int = 0) -> list[int]:
        found = [i for i in range(len(self)) if self.locate(i)[2] == start]
        if start and not found:
            check_start(start, 0)
        return found

    def trajectory_lengths(self) -> list[int]:
        meta = self.well.metadata  # per file: its trajectories and their frames
        return [int(n) for n, k in zip(meta.n_steps_per_trajectory, meta.n_trajectories_per_file) for _ in range(k)]

    def locate(self, index: int) -> tuple[str, int, int]:
        """``(file name, trajectory, start frame)`` of sample ``index`` (as ``WellDataset`` indexes)."""
        w = self.well
        if w.restriction_set is not None:
            index = int(w.restriction_set[index])
        file_idx = int(np.searchsorted(w.file_index_offsets, index, side="right") - 1)
        local = index - max(int(w.file_index_offsets[file_idx]), 0)
        per = w.n_windows_per_trajectory[file_idx]
        return Path(w.files_paths[file_idx]).name, local // per, local % per

    def _layout(self, name: str) -> tuple[list[tuple[h5py.Dataset, bool, bool]], np.ndarray]:
        """The field datasets of a file in ``WellDataset``'s order with their flags, and its time
        axis, read once per file and process (attributes are slow to read)."""
        def read() -> tuple[list[tuple[h5py.Dataset, bool, bool]], np.ndarray]:
            f = self._files.get(self.folder / name)
            fields = []
            for order in ("t0_fields", "t1_fields", "t2_fields"):
                if order in f:
                    for field in f[order].attrs["field_names"]:
                        ds = f[order][field]
                        fields.append((ds, bool(ds.attrs.get("sample_varying", True)),
                                       bool(ds.attrs.get("time_varying", True))))
            return fields, f["dimensions"]["time"][()]
        return self._files.memo(("layout", name), read)

    def _read(self, places: Sequence[tuple[str, int, int]]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Windows at ``places`` (`locate` of each) read straight from the files into schema layout.

        Returns the frames ``(B, T_in + T_out, C, *S)`` (float32), the constant fields
        ``(B, C_f, *S)`` or None, and the time of every frame ``(B, T_in + T_out)``. Scalar fields
        are read by HDF5 into their place in the batch (no intermediate copy); vector and tensor
        fields are read, then their components moved to the channel axis.
        """
        d = self.grid.ndim
        n = self.well.n_steps_input + self.well.n_steps_output
        fields = np.empty((len(places), n, len(self.field_names), *self.grid.shape), dtype=np.float32)
        constant, times = None, []
        for i, (file, traj, start) in enumerate(places):
            fields_of, time = self._layout(file)
            sel = slice(start, start + (n - 1) * self.stride + 1, self.stride)
            times.append((time[traj] if time.ndim > 1 else time)[sel])
            channel, parts = 0, []
            for ds, sample_varying, time_varying in fields_of:
                rows = (traj,) if sample_varying else ()
                comps = int(np.prod(ds.shape[len(rows) + time_varying + d:], dtype=int))
                if not time_varying:  # a constant field: theta_field
                    x = ds[rows] if rows else ds[()]
                    parts.append(np.moveaxis(x.reshape(*x.shape[:d], comps), -1, 0))
                elif ds.ndim == len(rows) + 1 + d:  # scalar field: HDF5 writes it into its channel
                    ds.read_direct(fields, np.s_[(*rows, sel)], np.s_[i, :, channel])
                else:
                    x = ds[(*rows, sel)]
                    fields[i, :, channel:channel + comps] = np.moveaxis(x.reshape(*x.shape[: 1 + d], comps), -1, 1)
                channel += comps * time_varying
            if parts:
                constant = constant if constant is not None else np.empty(
                    (len(places), sum(len(p) for p in parts), *self.grid.shape), dtype=np.float32)
                constant[i] = np.concatenate(parts)
        return fields, constant, np.stack(times)

    def _check_finite(self, frames: Tensor, indices: Sequence[int]) -> None:
        """Name the file, trajectory and frame of the first NaN or Inf in windows ``indices``.

        One sum per window first: it is finite if every value is, so the exact search runs only
        where a sum is not (a NaN or Inf, or a float32 overflow of large finite values, which
        the search then clears).
        """
        n_in = self.well.n_steps_input
        for i in torch.nonzero(~torch.isfinite(frames.flatten(1).sum(1))).flatten().tolist():
            finite = torch.isfinite(frames[i].flatten(1)).all(1)
            if not finite.all():
                file, traj, start = self.locate(indices[i])
                k = int(torch.nonzero(~finite)[0])
                key = "input_fields" if k < n_in else "output_fields"
                raise ValueError(f"{file}: NaN or Inf in trajectory {traj}, frame {start + k * self.stride} ({key})")

    def _kinds(self, codes: Sequence[int]) -> list[BCType]:
        try:
            return [WELL_BC[c] for c in codes]
        except KeyError as err:
            raise ValueError(f"{self.metadata.dataset_name}: unknown Well boundary code {err.args[0]} "
                             f"(known: {WELL_BC})") from None

    def _meta(self, index: int, place: tuple[str, int, int]) -> dict[str, Any]:
        return {"dataset": self.metadata.dataset_name, "fields": self.field_names, "parameters": self.parameter_names,
                "index": index, **dict(zip(("file", "trajectory", "start"), place))}

    def __getitem__(self, index: int) -> PDESample:
        with reading(self.folder, LAYOUT):
            return self._sample(index)

    def _sample(self, index: int) -> PDESample:
        if self.reader == "h5py":
            batch = self.__getitems__([index])
            return PDESample(u_in=batch.u_in[0], u_out=batch.u_out[0], theta=batch.theta[0], bc=batch.bc[0],
                             grid=self.grid, dt=float(batch.dt[0]), group=int(batch.group[0]), meta=batch.meta[0],
                             theta_field=None if batch.theta_field is None else batch.theta_field[0])
        s = self.well[index]
        d = self.grid.ndim
        frames = torch.cat([s["input_fields"], s["output_fields"]])
        self._check_finite(frames[None], [index])
        to_schema = lambda x: x.permute(0, d + 1, *range(1, d + 1)).float().contiguous()
        raw = s["constant_scalars"] if "constant_scalars" in s else torch.zeros(0, dtype=torch.float64)
        field = None
        if "constant_fields" in s and s["constant_fields"].shape[-1] > 0:
            field = s["constant_fields"].permute(d, *range(d)).float().contiguous()
        kinds = self._kinds(s["boundary_conditions"].long().flatten().tolist())
        key = tuple(raw.double().tolist())  # exact file values (theta is float32)
        dt = float(s["output_time_grid"][0] - s["input_time_grid"][-1])
        return PDESample(u_in=to_schema(s["input_fields"]), u_out=to_schema(s["output_fields"]), theta=raw.float(),
                         bc=BoundarySpec.from_types(kinds), grid=self.grid, dt=dt, theta_field=field,
                         group=self._groups.get(key, 0), meta=self._meta(index, self.locate(index)))

    def __getitems__(self, indices: Sequence[int]) -> PDEBatch | list[PDESample]:
        """A whole batch (what the DataLoader asks for). With ``reader="h5py"`` one `PDEBatch`
        whose frames are read straight into the batch (no per-sample objects, no stacking); it
        equals `collate` of the samples. With ``reader="the_well"`` the list of samples."""
        if self.reader == "the_well":
            return [self[i] for i in indices]
        with reading(self.folder, LAYOUT):
            return self._batch([int(i) for i in indices])

    def _batch(self, indices: list[int]) -> PDEBatch:
        places = [self.locate(i) for i in indices]
        fields, constant, times = self._read(places)
        frames = torch.from_numpy(fields)
        self._check_finite(frames, indices)
        n_in = self.well.n_steps_input
        raw = [tuple(self._scalars[file].get(k, np.nan) for k in self.parameter_names) for file, _, _ in places]
        bc = BoundarySpec.from_types(self._kinds(self._codes)).expand(len(indices))
        theta = torch.tensor(raw, dtype=torch.float32).reshape(len(indices), len(self.parameter_names))
        return PDEBatch(u_in=frames[:, :n_in], u_out=frames[:, n_in:], theta=theta, bc=bc, grid=self.grid,
                        dt=torch.from_numpy(times[:, n_in] - times[:, n_in - 1]).float(),
                        theta_field=None if constant is None else torch.from_numpy(constant),
                        group=torch.tensor([self._groups.get(r, 0) for r in raw], dtype=torch.long),
                        meta=[self._meta(i, place) for i, place in zip(indices, places)])


def check_well_file(path: Path) -> tuple[dict[str, float], tuple[tuple[int, ...], tuple[float, ...]]]:
    """Check a file of The Well's layout and return its constant scalars and its grid (cells per
    axis and side lengths, `gno_ext.adapters.files.grid_of`).

    Every field's shape must be what the file's axes give (trajectories, time, space and the
    component axes of its tensor order), the time axis must increase strictly, the coordinates
    must be evenly spaced, the constant scalars must be finite and every boundary condition must
    name a type of The Well's and spatial axes of the file: a mismatch raises `ValueError`
    naming the file, the field and both shapes, before any window is read (a short field would
    otherwise be broadcast into a batch).
    """
    with opening(path, LAYOUT), open_h5(path) as f:
        try:
            n = int(f.attrs["n_trajectories"])
            dims = f["dimensions"]
            names = [str(a.decode() if isinstance(a, bytes) else a) for a in dims.attrs["spatial_dims"]]
            space = tuple(int(dims[a].shape[-1]) for a in names)
            time = dims["time"][()]
        except KeyError as err:
            raise ValueError(f"{path}: not in The Well's layout (missing {err})") from None
        _check_boundaries(f, path, names)
        steps = np.diff(time, axis=-1)
        if not np.all(np.isfinite(time)) or not np.all(steps > 0):
            bad = np.flatnonzero(~(np.isfinite(steps) & (steps > 0)).reshape(-1))
            raise ValueError(f"{path}: dimensions/time must increase strictly; it does not after entry "
                             f"{int(bad[0]) if len(bad) else 0} (values {np.round(time.reshape(-1)[:6], 6).tolist()} ...)")
        for order in (0, 1, 2):
            group = f.get(f"t{order}_fields")
            if group is None:
                continue
            for field in group.attrs.get("field_names", []):
                field = field.decode() if isinstance(field, bytes) else str(field)
                ds = group[field]
                expected = ((n,) if ds.attrs.get("sample_varying", True) else ()) + \
                    ((time.shape[-1],) if ds.attrs.get("time_varying", True) else ()) + space + (len(space),) * order
                if tuple(ds.shape) != expected:
                    raise ValueError(f"{path}: field t{order}_fields/{field} has shape {tuple(ds.shape)}, but the "
                                     f"file's axes give {expected} (n_trajectories {n}, {time.shape[-1]} times, space "
                                     f"{space}{f', {order} component axes' if order else ''})")
        scalars = {}
        for key, v in (f["scalars"].items() if "scalars" in f else []):
            if v.shape == () and not v.attrs.get("time_varying", False):
                scalars[key] = float(v[()])
                if not np.isfinite(scalars[key]):
                    raise ValueError(f"{path}: constant scalar {key} = {scalars[key]}: not a finite number")
        return scalars, grid_of(f, path)


def _check_boundaries(f: h5py.File, path: Path, axes: list[str]) -> None:
    """Each group of ``boundary_conditions`` names a type of `WELL_BC` (``bc_type``) and axes
    among the file's spatial ``axes`` (``associated_dims``), or a `ValueError` names it."""
    types = sorted(kind.name for kind in WELL_BC.values())
    for name, group in f.get("boundary_conditions", {}).items():
        kind = group.attrs.get("bc_type")
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if not isinstance(kind, str) or kind.upper() not in types:
            raise ValueError(f"{path}: boundary_conditions/{name} has bc_type {kind!r}, not one of {', '.join(types)}")
        dims = [d.decode() if isinstance(d, bytes) else d for d in np.atleast_1d(group.attrs.get("associated_dims", []))]
        if not dims or not all(isinstance(d, str) and d in axes for d in dims):
            raise ValueError(f"{path}: boundary_conditions/{name} is associated with {dims}, not with axes of the file "
                             f"({', '.join(axes)})")
