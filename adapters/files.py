"""HDF5 files opened lazily, once per process, and errors that name the file read.

h5py handles do not survive a fork or a pickle into DataLoader workers: `ProcessFiles` opens a
file on first use in each process, keeps it open for later reads, and pickles as empty.
`opening` and `reading` are the boundary every adapter opens and reads a file through:
whatever a malformed file makes go wrong becomes one `ValueError` that names the file.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from gno_ext._files import check_self_contained

__all__ = ["ProcessFiles", "check_one_grid", "grid_of", "open_h5", "opening", "reading"]


@contextlib.contextmanager
def reading(path: str | Path, layout: str) -> Iterator[None]:
    """Name ``path`` (a file, or the folder of a split) in any error raised while it is read as
    ``layout`` (e.g. "The Well's layout"). The project's own errors (`ValueError`, `KeyError`,
    `FileNotFoundError`) that do not name it get it in front; what a malformed file makes the
    readers below raise (h5py's `OSError` for a missing attribute or object, numpy's and
    torch's `TypeError` for a dataset of text, an `IndexError` for a dataset of the wrong
    shape, the assertions of The Well's reader, ...) becomes a `ValueError` that names the
    file and the layout, with the reader's message on the same line (the original is chained;
    ``GNO_EXT_DEBUG=1`` shows its traceback in the command-line tools). Cheap enough for every
    window read; files are opened under `opening`."""
    path = Path(path)
    try:
        yield
    except (ValueError, KeyError, FileNotFoundError) as err:
        message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        if str(path) in message or (path.name and f"{path.name}:" in message):
            raise
        kind = FileNotFoundError if isinstance(err, FileNotFoundError) else KeyError if isinstance(err, KeyError) \
            else ValueError
        raise kind(f"{path}: {_one_line(message)}") from err
    except (OSError, TypeError, IndexError, AttributeError, RuntimeError, ArithmeticError, AssertionError) as err:
        raise ValueError(f"{path}: not readable in {layout} ({type(err).__name__}: {_one_line(str(err))})") from err


@contextlib.contextmanager
def opening(path: str | Path, layout: str) -> Iterator[None]:
    """`reading`, for the opening of a file, where also a complex value read where a real one
    belongs (numpy's and torch's warning that they drop the imaginary part) is an error naming
    it. Not for every window: changing the warning filters resets Python's record of the
    warnings already shown, anywhere in the process."""
    path = Path(path)
    try:
        with reading(path, layout), warnings.catch_warnings():
            warnings.filterwarnings("error", category=np.exceptions.ComplexWarning)
            warnings.filterwarnings("error", message="Casting complex values to real")  # (torch's)
            yield
    except Warning as err:
        raise ValueError(f"{path}: holds complex values where {layout} has real numbers ({_one_line(str(err))})") \
            from None


def _one_line(message: str) -> str:
    """The first line of a message, at most 300 characters."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= 300 else first[:297] + "..."


def open_h5(path: str | Path) -> h5py.File:
    """``h5py.File(path, "r")`` with an error that names the file: a missing, empty, truncated or
    non-HDF5 file raises `ValueError` (`FileNotFoundError` if it does not exist), and so does one
    that is not self-contained (`gno_ext._files.check_self_contained`: external or virtual
    storage in other files, datasets that declare far more than they store)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as err:  # h5py: "unable to synchronously open file (...)", without the name
        size = path.stat().st_size if path.is_file() else None
        what = "an empty file" if size == 0 else "not a readable HDF5 file"
        raise ValueError(f"{path}: {what} ({err})") from err
    try:
        check_self_contained(f, path)  # no reads of other files, no allocation far beyond the file
    except ValueError:
        f.close()
        raise
    return f


def grid_of(f: h5py.File, path: str | Path) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The cells per axis and the box's side lengths of a file in The Well's layout, from its
    ``dimensions`` coordinates (cell centres, evenly spaced). Coordinates that are not evenly
    spaced, or an axis of fewer than two points, raise a `ValueError` naming the file and the
    axis: the models take a uniform grid, and its extent would be wrong."""
    shape, extent = [], []
    for axis in f["dimensions"].attrs["spatial_dims"]:
        axis = axis.decode() if isinstance(axis, bytes) else str(axis)
        c = np.asarray(f["dimensions"][axis][()], dtype=np.float64)
        if c.ndim != 1 or len(c) < 2:
            raise ValueError(f"{path}: dimensions/{axis} holds {c.size} coordinate(s); a grid axis needs at least 2")
        steps = np.diff(c)
        if not (steps[0] > 0 and np.allclose(steps, steps[0], rtol=1e-3, atol=0)):
            raise ValueError(f"{path}: dimensions/{axis} is not evenly spaced (steps {steps.min():.6g} to "
                             f"{steps.max():.6g}); the models take a uniform grid")
        shape.append(len(c))
        extent.append(float(len(c) * steps[0]))
    return tuple(shape), tuple(extent)


def check_one_grid(files: list[Path], grids: list[tuple[tuple[int, ...], tuple[float, ...]]]) -> None:
    """Raise a `ValueError` naming the first of ``files`` whose grid (cells per axis, side lengths;
    `grid_of`) differs from the first file's: one split is read on one grid."""
    for file, grid in zip(files, grids):
        if grid != grids[0]:
            raise ValueError(f"{file}: its grid {grid[0]} of extent {grid[1]} differs from {Path(files[0]).name}'s "
                             f"{grids[0][0]} of extent {grids[0][1]}; one split holds one grid")


class ProcessFiles:
    """Open HDF5 files (read-only) and per-file values derived from them, for this process only."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._cache: dict[Hashable, Any] = {}

    def _local(self) -> dict[Hashable, Any]:
        if self._pid != os.getpid():  # a new process (worker): nothing opened here yet
            self._pid, self._cache = os.getpid(), {}
        return self._cache

    def get(self, path: str | Path) -> h5py.File:
        """The file at ``path``, opened once in this process."""
        return self.memo(("file", str(path)), lambda: open_h5(path))

    def memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """A value computed once per process (e.g. a file's dataset layout)."""
        cache = self._local()
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def __getstate__(self) -> dict[str, Any]:
        return {"_pid": None, "_cache": {}}
