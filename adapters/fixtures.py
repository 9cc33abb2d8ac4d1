"""Writers of small files in the published layouts, for tests, benchmarks and examples.

The real datasets are large downloads; these write files with exactly their structure
(names, shapes, attributes), filled with random numbers, and return what they wrote.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

__all__ = ["write_well_trl", "write_trl_dataset", "write_pdebench_tensor", "write_pdebench_cfd", "write_pdebench_seeds"]


def write_well_trl(path: str | Path, tcool: float, seed: int = 0, n: int = 2, t: int = 4,
                   shape: tuple[int, int] = (128, 384)) -> np.ndarray:
    """A file of The Well's turbulent_radiative_layer_2D: density, pressure (t0), velocity (t1),
    x periodic, y open, constant scalar ``tcool``.

    Returns the fields as ``(n, t, X, Y, 4)`` in the order density, pressure, velocity_x, velocity_y.
    """
    nx, ny = shape
    rng = np.random.default_rng(seed)
    density = rng.random((n, t, nx, ny), dtype=np.float32)
    pressure = rng.random((n, t, nx, ny), dtype=np.float32)
    velocity = rng.standard_normal((n, t, nx, ny, 2), dtype=np.float32)
    with h5py.File(path, "w") as f:
        f.attrs.update({"dataset_name": "turbulent_radiative_layer_2D", "grid_type": "cartesian",
                        "n_spatial_dims": 2, "n_trajectories": n, "simulation_parameters": ["tcool"],
                        "tcool": tcool})
        dims = f.create_group("dimensions")
        dims.attrs["spatial_dims"] = ["x", "y"]
        for name, values in (("time", np.arange(t) * 0.0159), ("x", np.linspace(-0.5, 0.5, nx, endpoint=False)),
                             ("y", np.linspace(-1, 2, ny, endpoint=False))):
            dims[name] = values.astype(np.float32)
            dims[name].attrs["sample_varying"] = False
        bcs = f.create_group("boundary_conditions")
        for name, dim, kind, size in (("x_periodic", "x", "PERIODIC", nx), ("y_open", "y", "OPEN", ny)):
            g = bcs.create_group(name)
            g.attrs.update({"associated_dims": [dim], "associated_fields": [], "bc_type": kind,
                            "sample_varying": False, "time_varying": False})
            mask = np.zeros(size, dtype=bool)
            mask[[0, -1]] = True
            g["mask"] = mask
        scalars = f.create_group("scalars")
        scalars.attrs["field_names"] = ["tcool"]
        scalars["tcool"] = tcool
        scalars["tcool"].attrs.update({"sample_varying": False, "time_varying": False})
        for order, fields in ((0, {"density": density, "pressure": pressure}), (1, {"velocity": velocity}), (2, {})):
            g = f.create_group(f"t{order}_fields")
            g.attrs["field_names"] = list(fields)
            for name, value in fields.items():
                g[name] = value
                g[name].attrs.update({"dim_varying": [True, True], "sample_varying": True, "time_varying": True})
    return np.concatenate([density[..., None], pressure[..., None], velocity], -1)


def write_pdebench_tensor(path: str | Path, n: int = 3, t: int = 7, x: int = 16, seed: int = 0) -> np.ndarray:
    """The 1-D single-tensor layout (``tensor``, ``x-coordinate``, ``t-coordinate`` with t + 1 times)."""
    data = np.random.default_rng(seed).standard_normal((n, t, x)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f["tensor"] = data
        f["x-coordinate"] = ((np.arange(x) + 0.5) / x).astype(np.float32)
        f["t-coordinate"] = (np.arange(t + 1) * 0.05).astype(np.float32)
    return data


def write_pdebench_cfd(path: str | Path, n: int = 2, t: int = 5, x: int = 16, y: int = 8,
                       seed: int = 1) -> dict[str, np.ndarray]:
    """The 2-D CFD layout (``density``, ``Vx``, ``Vy``, ``pressure`` with coordinates) on [0,1] x [0,2]."""
    rng = np.random.default_rng(seed)
    fields = {k: rng.standard_normal((n, t, x, y)).astype(np.float32) for k in ("density", "Vx", "Vy", "pressure")}
    with h5py.File(path, "w") as f:
        for k, v in fields.items():
            f[k] = v
        f["x-coordinate"] = np.linspace(0, 1, x, endpoint=False) + 0.5 / x
        f["y-coordinate"] = np.linspace(0, 2, y, endpoint=False) + 1.0 / y
        f["t-coordinate"] = np.arange(t) * 0.1
    return fields


def write_pdebench_seeds(path: str | Path, n: int = 3, t: int = 6, shape: tuple[int, int] = (8, 8), c: int = 2,
                         seed: int = 2) -> dict[int, np.ndarray]:
    """The per-seed layout (groups ``0000``... with ``data`` (t, X, Y, c) and ``grid/x, y, t``)."""
    rng = np.random.default_rng(seed)
    data = {}
    with h5py.File(path, "w") as f:
        for i in range(n):
            g = f.create_group(f"{i:04d}")
            data[i] = rng.standard_normal((t, *shape, c)).astype(np.float32)
            g["data"] = data[i]
            g["grid/x"] = np.linspace(-1, 1, shape[0])
            g["grid/y"] = np.linspace(-1, 1, shape[1])
            g["grid/t"] = np.linspace(0, 5, t)
    return data


def write_trl_dataset(base: str | Path, tcools: dict[str, tuple[float, ...]] | None = None, n: int = 2, t: int = 12,
                      shape: tuple[int, int] = (128, 384)) -> Path:
    """A Well base path holding turbulent_radiative_layer_2D in the published layout (one file per
    tcool per split, ``datasets/turbulent_radiative_layer_2D/data/{train,valid,test}``), reduced
    in trajectories and frames. Returns ``base``."""
    tcools = tcools or {"train": (0.03, 0.1, 0.32), "valid": (0.1,), "test": (0.03, 0.32)}
    base = Path(base)
    for k, (split, values) in enumerate(tcools.items()):
        folder = base / "datasets" / "turbulent_radiative_layer_2D" / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, tcool in enumerate(values):
            write_well_trl(folder / f"turbulent_radiative_layer_tcool_{tcool}.hdf5", tcool, seed=100 * k + i, n=n,
                           t=t, shape=shape)
    return base
