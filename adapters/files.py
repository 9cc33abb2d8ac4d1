"""HDF5 files opened lazily, once per process.

h5py handles do not survive a fork or a pickle into DataLoader workers: `ProcessFiles` opens a
file on first use in each process, keeps it open for later reads, and pickles as empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import h5py

from gno_ext._files import check_self_contained

__all__ = ["ProcessFiles", "open_h5"]


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
