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

__all__ = ["ProcessFiles"]


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
        return self.memo(("file", str(path)), lambda: h5py.File(path, "r"))

    def memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """A value computed once per process (e.g. a file's dataset layout)."""
        cache = self._local()
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def __getstate__(self) -> dict[str, Any]:
        return {"_pid": None, "_cache": {}}
