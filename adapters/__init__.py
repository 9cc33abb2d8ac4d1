"""Dataset adapters, installed as ``gno_ext.adapters``: every source yields `PDESample`s.

    from gno_ext.adapters import open_dataset
    ds = open_dataset("the_well", "/data/the_well", name="turbulent_radiative_layer_2D", n_steps_input=1)
    ds = open_dataset("pdebench", "1D_Advection_Sols_beta0.1.hdf5", n_steps_output=1)
    ds = open_dataset("custom", "my_runs.h5")          # or ArrayDataset(arrays...)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gno_ext.adapters.custom import ArrayDataset, open_custom
from gno_ext.adapters.pdebench import PDEBenchDataset, parameters_from_name
from gno_ext.adapters.windows import Windows
from torch.utils.data import Dataset

__all__ = ["open_dataset", "ArrayDataset", "PDEBenchDataset", "WellAdapter", "Windows", "open_custom",
           "parameters_from_name"]


def open_dataset(kind: str, path: str | Path, n_steps_input: int = 1, n_steps_output: int = 1,
                 **kwargs: Any) -> Dataset:
    """Open a dataset of `PDESample` windows.

    Parameters
    ----------
    kind : {"the_well", "pdebench", "custom"}
        Source format.
    path : str or Path
        The Well: base path (with ``name=``) or split folder. PDEBench: an HDF5 file. Custom: an
        HDF5 or ``.npz`` file with the names of `gno_ext.adapters.custom`.
    n_steps_input, n_steps_output : int
        Frames per window.
    **kwargs
        Passed to `WellAdapter` or `PDEBenchDataset` (``split``, ``stride``, ...).
    """
    if kind == "the_well":
        from gno_ext.adapters.the_well import WellAdapter

        return WellAdapter(path, n_steps_input, n_steps_output, **kwargs)
    if kind == "pdebench":
        return PDEBenchDataset(path, n_steps_input, n_steps_output, **kwargs)
    if kind == "custom":
        return open_custom(path, n_steps_input, n_steps_output, **kwargs)
    raise ValueError(f"kind: expected 'the_well', 'pdebench' or 'custom', got {kind!r}")


def __getattr__(name: str):
    if name == "WellAdapter":
        from gno_ext.adapters.the_well import WellAdapter

        return WellAdapter
    raise AttributeError(f"module 'gno_ext.adapters' has no attribute {name!r}")
