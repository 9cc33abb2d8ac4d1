"""Whole-or-nothing file writes, and one writer at a time.

A file is written under a temporary name beside its target and renamed onto it only when the
write ends without an error, so a reader (or a resumed job) never sees a half-written dataset,
manifest or result. `held` gives a folder one writing process (an advisory lock that the
operating system releases when the process ends, however it ends)."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class Busy(RuntimeError):
    """Another process holds the lock; ``holder`` is what it recorded (pid, host, since when)."""

    def __init__(self, lock: Path, holder: str) -> None:
        super().__init__(f"{lock}: held by {holder or 'another process'}")
        self.lock, self.holder = lock, holder


@contextlib.contextmanager
def held(lock: str | Path, wait: bool = False, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive advisory lock on the file ``lock`` for the block, with this process's
    pid, host and start time written in it. Where another process holds it: wait for it
    (``wait``, after calling ``on_wait`` with the holder's record) or raise `Busy` naming the
    holder. The lock goes with the process, also when it is killed."""
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as handle:  # (not truncated: a holder's record stays readable)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            if not wait:
                raise Busy(lock, holder) from None
            if on_wait is not None:
                on_wait(holder)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{datetime.datetime.now().isoformat(timespec='seconds')}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


def temporary_name(path: Path) -> Path:
    """The hidden name a write of ``path`` uses until it is complete (``.NAME.tmp-PID``)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """Yield the temporary path to write ``path``'s contents to; on leaving the block without an
    error it is renamed to ``path`` (atomically, replacing an older file), and on an error it is
    removed and ``path`` is left as it was. The parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # (gone after the rename)


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path``, whole or not at all (`written_whole`)."""
    with written_whole(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
    return Path(path)


# how many times the bytes it stores a dataset may declare: uncompressed, and compressed (gzip
# packs a field of zeros about 400 to 1); a file that declares 2^30 values in 2 kB would make a
# reader allocate gigabytes
DECLARED_PER_STORED = 100
DECLARED_PER_STORED_COMPRESSED = 10_000


def check_self_contained(f: Any, path: str | Path) -> None:
    """Refuse an HDF5 file (an open ``h5py.File``) that reading for training would make read
    other files or allocate far more than it holds: a dataset with external storage, a virtual
    dataset that maps another file, or a dataset (beyond 1 MiB) that declares more than
    ``DECLARED_PER_STORED`` times the bytes it stores (``DECLARED_PER_STORED_COMPRESSED`` where
    it is compressed). The `ValueError` names the file and the dataset."""
    import h5py

    def visit(name: str, obj: Any) -> None:
        if not isinstance(obj, h5py.Dataset):
            return
        where = f"{path}: dataset {name!r}"
        if obj.external:
            raise ValueError(f"{where} keeps its values in other files ({', '.join(str(e[0]) for e in obj.external)}): "
                             "refused (a data file must hold its own values)")
        if obj.is_virtual:
            others = sorted({s.file_name for s in obj.virtual_sources() if s.file_name != "."})
            if others:
                raise ValueError(f"{where} is a virtual dataset that maps other files ({', '.join(others)}): refused "
                                 "(a data file must hold its own values)")
            return
        stored = obj.id.get_storage_size()
        ratio = DECLARED_PER_STORED if obj.compression is None else DECLARED_PER_STORED_COMPRESSED
        if obj.nbytes > 2**20 and obj.nbytes > ratio * stored:
            raise ValueError(f"{where} declares shape {obj.shape} ({obj.nbytes} bytes) but stores {stored} bytes: "
                             "refused (its values were never written, or it is not a data file)")

    f.visititems(visit)
