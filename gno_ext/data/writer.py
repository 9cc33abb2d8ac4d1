"""Write trajectories in The Well's HDF5 layout, with our complete boundary description.

The Well's reader (``the_well.data.WellDataset``) opens the files: fields go to ``t0_fields``
(scalar fields, e.g. ``u``) or ``t1_fields`` (vector fields, e.g. ``velocity``), the parameter
to a sample-varying scalar, the advection velocity to a sample-varying, time-constant
``t1_fields/velocity_field``. The Well's boundary codes per face are WALL (our Dirichlet), OPEN
(Neumann, Robin) and PERIODIC; one file holds one boundary-type configuration (the reader
caches masks per file).

Our exact description travels in the group ``gno_ext`` (the layout allows extra groups):
``bc_kind`` (n, F) `BCType` codes, ``bc_values`` (n, F, T_bc, N_face), ``bc_coeffs`` (n, F, 2),
``theta`` (n, P), ``trajectory_index``, ``seed`` and ``group`` (parameter index) (n,), and attributes ``preset``,
``split``, ``parameter_names``, ``schema_version``.

Files are written under a temporary name and renamed when complete.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from gno_ext._files import written_whole
from gno_ext.schema import FACE_NAMES, BCType, BoundarySpec, Grid

__all__ = ["write_well_file", "WELL_CODE", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
WELL_CODE = {BCType.PERIODIC: "PERIODIC", BCType.DIRICHLET: "WALL", BCType.NEUMANN: "OPEN", BCType.ROBIN: "OPEN",
             BCType.WALL: "WALL", BCType.OPEN: "OPEN"}


def _flags(group: h5py.Group | h5py.Dataset, sample: bool, time: bool, dims: int | None = None) -> None:
    group.attrs["sample_varying"] = sample
    group.attrs["time_varying"] = time
    if dims is not None:
        group.attrs["dim_varying"] = [True] * dims


def write_well_file(path: str | Path, u: Tensor, field_names: list[str], grid: Grid, times: Tensor,
                    bc: BoundarySpec, theta: Tensor, parameter_names: list[str], dataset_name: str,
                    theta_field: Tensor | None = None, trajectory_index: Tensor | None = None,
                    seed: Tensor | None = None, group: Tensor | None = None, attrs: dict | None = None,
                    dtype: str = "float32") -> Path:
    """Write ``n`` trajectories to ``path`` atomically.

    Parameters
    ----------
    u : Tensor, shape (n, T, C, *S)
        Fields; ``C`` is 1 (scalar field ``field_names[0]``) or ``d`` (one vector field whose
        components are ``field_names``).
    field_names : list of str
    grid : Grid
    times : Tensor, shape (T,)
    bc : BoundarySpec
        Batched (n rows); every row must have the same types (one configuration per file).
    theta : Tensor, shape (n, P)
    parameter_names : list of str
    dataset_name : str
    theta_field : Tensor, shape (n, d, *S), optional
        A sample-varying, time-constant vector field (the advection velocity).
    trajectory_index, seed : Tensor, shape (n,), optional
    group : Tensor, shape (n,), optional
        Parameter index of each trajectory (DRO groups are built from it).
    attrs : dict, optional
        Extra attributes of the ``gno_ext`` group.
    dtype : {"float32", "float16"}
        Storage type of the fields (float16 halves the disk size; relative rounding 5e-4).
    """
    path = Path(path)
    n, c, d = u.shape[0], u.shape[2], grid.ndim
    if (bc.kind != bc.kind[:1]).any():
        raise ValueError(f"{path.name}: one file holds one boundary-type configuration; got several")
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype: expected 'float32' or 'float16', got {dtype!r}")
    if c not in (1, d):
        raise ValueError(f"u: {c} channels are neither one scalar nor one {d}-vector field")
    axes = "xyz"[:d]
    with written_whole(path) as tmp, h5py.File(tmp, "w") as f:
        f.attrs.update({"dataset_name": dataset_name, "grid_type": "cartesian", "n_spatial_dims": d,
                        "n_trajectories": n, "simulation_parameters": parameter_names})
        dims = f.create_group("dimensions")
        dims.attrs["spatial_dims"] = list(axes)
        dims["time"] = times.numpy().astype(np.float32)
        _flags(dims["time"], False, False)
        for a, name in enumerate(axes):
            dims[name] = grid.axis_coordinates(a).numpy().astype(np.float32)
            _flags(dims[name], False, False)
        _write_boundary_masks(f.create_group("boundary_conditions"), bc, grid, axes)
        scalars = f.create_group("scalars")
        scalars.attrs["field_names"] = parameter_names
        for j, name in enumerate(parameter_names):
            scalars[name] = theta[:, j].double().numpy()
            _flags(scalars[name], True, False)
        _write_fields(f, u.numpy().astype(dtype), field_names, theta_field, d)
        ours = f.create_group("gno_ext")
        ours.attrs.update({"schema_version": SCHEMA_VERSION, "parameter_names": parameter_names,
                           "faces": list(FACE_NAMES[: 2 * d]), **(attrs or {})})
        ours["bc_kind"] = bc.kind.numpy()
        ours["bc_values"] = bc.values.float().numpy()
        ours["bc_coeffs"] = bc.robin_coeffs().float().numpy()
        ours["theta"] = theta.double().numpy()
        for key, value in (("trajectory_index", trajectory_index), ("seed", seed), ("group", group)):
            if value is not None:
                ours[key] = torch.as_tensor(value).numpy()
    return path


def _write_boundary_masks(bcs: h5py.Group, bc: BoundarySpec, grid: Grid, axes: str) -> None:
    """The Well's ``boundary_conditions`` group: one entry per axis (both ends of one type) or per
    end, with its type and the mask of the cells it covers."""
    kinds = [BCType(int(k)) for k in bc.kind[0]]
    for a, name in enumerate(axes):
        lo, hi = kinds[2 * a], kinds[2 * a + 1]
        sides = [("", (0, -1), lo)] if WELL_CODE[lo] == WELL_CODE[hi] else [("_lo", (0,), lo), ("_hi", (-1,), hi)]
        for suffix, ends, kind in sides:
            g = bcs.create_group(f"{name}_{WELL_CODE[kind].lower()}{suffix}")
            g.attrs.update({"associated_dims": [name], "associated_fields": [], "bc_type": WELL_CODE[kind]})
            _flags(g, False, False)
            mask = np.zeros(grid.shape[a], dtype=bool)
            mask[list(ends)] = True
            g["mask"] = mask


def _write_fields(f: h5py.File, data: np.ndarray, field_names: list[str], theta_field: Tensor | None,
                  d: int) -> None:
    """The fields ``data`` (n, T, C, *S): one scalar field in ``t0_fields`` (C = 1) or one vector
    field in ``t1_fields`` (C = d), and the velocity field ``theta_field`` in ``t1_fields``."""
    t0, t1 = f.create_group("t0_fields"), f.create_group("t1_fields")
    f.create_group("t2_fields").attrs["field_names"] = []
    if data.shape[2] == 1:
        t0.attrs["field_names"] = field_names[:1]
        t0[field_names[0]] = data[:, :, 0]
        _flags(t0[field_names[0]], True, True, d)
        t1_names = []
    else:
        vector = field_names[0].rsplit("_", 1)[0]
        t0.attrs["field_names"] = []
        t1[vector] = np.moveaxis(data, 2, -1)
        _flags(t1[vector], True, True, d)
        t1_names = [vector]
    if theta_field is not None:
        t1["velocity_field"] = np.moveaxis(theta_field.numpy().astype(np.float32), 1, -1)
        _flags(t1["velocity_field"], True, False, d)
        t1_names.append("velocity_field")
    t1.attrs["field_names"] = t1_names
