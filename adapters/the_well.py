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
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

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
    **well_kwargs
        Passed to ``WellDataset``.
    """

    def __init__(self, path: str | Path, n_steps_input: int = 1, n_steps_output: int = 1, split: str = "train",
                 name: str | None = None, stride: int = 1, normalize: bool = False,
                 parameter_filter: Callable[[dict], bool] | None = None, **well_kwargs: Any) -> None:
        from the_well.data import WellDataset

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

    def __getitem__(self, index: int) -> PDESample:
        s = self.well[index]
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
