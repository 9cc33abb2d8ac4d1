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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from gno_ext.adapters.files import ProcessFiles
from gno_ext.schema import BCType, BoundarySpec, Grid, PDESample

__all__ = ["WellAdapter", "WELL_BC"]

WELL_BC = {0: BCType.WALL, 1: BCType.OPEN, 2: BCType.PERIODIC}  # the_well.data.datasets.BoundaryCondition


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

        if reader not in ("the_well", "h5py"):
            raise ValueError(f"reader: expected 'the_well' or 'h5py', got {reader!r}")
        if reader == "h5py" and normalize:
            raise ValueError("normalize=True needs reader='the_well' (the direct reader returns raw fields)")
        self.reader, self.stride = reader, stride

        folder = _split_folder(Path(path), name, split)
        files = sorted(list(folder.glob("*.hdf5")) + list(folder.glob("*.h5")))
        params = [self._constant_scalars(f) for f in files]
        include = [f.name for f, p in zip(files, params) if parameter_filter is None or parameter_filter(p)]
        if not include:
            raise ValueError(f"{folder}: parameter_filter kept no file")
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
        with h5py.File(files[0], "r") as f:
            dims = [f["dimensions"][a][()] for a in f["dimensions"].attrs["spatial_dims"]]
        extent = tuple(float(len(c) * (c[1] - c[0])) for c in dims)
        self.grid = Grid(tuple(meta.spatial_resolution), extent)
        self._files = ProcessFiles()
        if reader == "h5py":  # what does not change from window to window, once
            first = self.well[0]
            self._codes = first["boundary_conditions"].long().flatten().tolist()
            self._folder = folder
            self._scalars = {Path(f).name: p for f, p in zip(files, params)}

    @staticmethod
    def _constant_scalars(file: Path) -> dict[str, float]:
        with h5py.File(file, "r") as f:
            if "scalars" not in f:
                return {}
            return {k: float(v[()]) for k, v in f["scalars"].items()
                    if v.shape == () and not v.attrs.get("time_varying", False)}

    def __len__(self) -> int:
        return len(self.well)

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
            f = self._files.get(self._folder / name)
            fields = []
            for order in ("t0_fields", "t1_fields", "t2_fields"):
                if order in f:
                    for field in f[order].attrs["field_names"]:
                        ds = f[order][field]
                        fields.append((ds, bool(ds.attrs.get("sample_varying", True)),
                                       bool(ds.attrs.get("time_varying", True))))
            return fields, f["dimensions"]["time"][()]
        return self._files.memo(("layout", name), read)

    def _direct(self, index: int) -> dict[str, Any]:
        """The fields of window ``index`` read from the file, in ``WellDataset``'s layout."""
        file, traj, start = self.locate(index)
        fields_of, time = self._layout(file)
        n_in, n_out = self.well.n_steps_input, self.well.n_steps_output
        sel = slice(start, start + (n_in + n_out - 1) * self.stride + 1, self.stride)
        variable, constant = [], []
        for ds, sample_varying, time_varying in fields_of:
            rows = (traj,) if sample_varying else ()
            if time_varying:
                x = torch.from_numpy(np.ascontiguousarray(ds[(*rows, sel)]))  # (T, *S, comps...)
                variable.append(x.reshape(*x.shape[: 1 + self.grid.ndim], -1))
            else:
                x = torch.from_numpy(np.ascontiguousarray(ds[rows] if rows else ds[()]))
                constant.append(x.reshape(*x.shape[: self.grid.ndim], -1))
        fields = torch.cat(variable, -1)
        t = time[traj] if time.ndim > 1 else time
        names = self.parameter_names
        scalars = self._scalars[file]
        out = {"input_fields": fields[:n_in], "output_fields": fields[n_in:],
               "constant_scalars": torch.tensor([scalars[k] for k in names], dtype=torch.float64),
               "boundary_conditions": torch.tensor(self._codes),
               "input_time_grid": torch.as_tensor(t[sel][:n_in]), "output_time_grid": torch.as_tensor(t[sel][n_in:])}
        if constant:
            out["constant_fields"] = torch.cat(constant, -1)
        return out

    def __getitem__(self, index: int) -> PDESample:
        s = self.well[index] if self.reader == "the_well" else self._direct(index)
        d = self.grid.ndim
        for key in ("input_fields", "output_fields"):
            finite = torch.isfinite(s[key].flatten(1)).all(1)
            if not finite.all():
                file, traj, start = self.locate(index)
                frame = start + int(torch.nonzero(~finite)[0]) + (self.well.n_steps_input if key == "output_fields" else 0)
                raise ValueError(f"{file}: NaN or Inf in trajectory {traj}, frame {frame} ({key})")
        to_schema = lambda x: x.permute(0, d + 1, *range(1, d + 1)).float().contiguous()
        raw = s["constant_scalars"] if "constant_scalars" in s else torch.zeros(0, dtype=torch.float64)
        theta = raw.float()
        field = None
        if "constant_fields" in s and s["constant_fields"].shape[-1] > 0:
            field = s["constant_fields"].permute(d, *range(d)).float().contiguous()
        codes = s["boundary_conditions"].long().flatten().tolist()
        try:
            kinds = [WELL_BC[c] for c in codes]
        except KeyError as err:
            raise ValueError(f"{self.metadata.dataset_name}: unknown Well boundary code {err.args[0]} "
                             f"(known: {WELL_BC})") from None
        key = tuple(raw.double().tolist())  # exact file values (theta is float32)
        dt = float(s["output_time_grid"][0] - s["input_time_grid"][-1])
        return PDESample(u_in=to_schema(s["input_fields"]), u_out=to_schema(s["output_fields"]), theta=theta,
                         bc=BoundarySpec.from_types(kinds), grid=self.grid, dt=dt, theta_field=field,
                         group=self._groups.get(key, 0),
                         meta={"dataset": self.metadata.dataset_name, "fields": self.field_names,
                               "parameters": self.parameter_names, "index": index,
                               **dict(zip(("file", "trajectory", "start"), self.locate(index)))})
