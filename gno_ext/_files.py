"""Whole-or-nothing file writes, and one writer at a time.

A file is written under a temporary name beside its target and renamed onto it only when the
write ends without an error, so a reader (or a resumed job) never sees a half-written dataset,
manifest or result (`written_whole`, and `written_whole_folder` for a folder of files). A write
that fails because the disk (or the quota, or the file-size limit) is full raises `DiskFull`,
which names the file and the folder's free space, not the writer's own message ("unexpected pos
1920 vs 1812", HDF5's error stack); nothing of the partial write is left behind. `held` gives a
folder one writing process (an advisory lock that the operating system releases when the
process ends, however it ends)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import resource
import shutil
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


def remove_leftovers(folder: Path, names: re.Pattern[str]) -> None:
    """Remove what killed writes left in ``folder``: the hidden files and folders whose names
    match ``names`` (the `temporary_name`s of `written_whole` and `written_whole_folder`, and
    the latter's ``.NAME.old-PID``). Call it where one process writes the folder (a lock)."""
    for path in folder.glob(".*"):
        if not names.match(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


class DiskFull(OSError):
    """A write failed for lack of space: the disk or the quota is full (``errno.ENOSPC``,
    ``errno.EDQUOT``), or the process's file-size limit was reached (``errno.EFBIG``, ``ulimit
    -f``). The message names the file, the cause and the free space of its folder."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
FULL_BELOW = 2**20  # a folder with less free space than this after a failed write is full


def _lack_of_space(err: BaseException, tmp: Path) -> int | None:
    """The errno of the lack of space that made a write to ``tmp`` (a file, or a folder of
    files) fail with ``err``, or None when it failed for another reason. Libraries report it
    their own way: an `OSError` with the errno (Python's files), the errno inside the message
    (HDF5: ``errno = 28``; the safetensors writer: ``os error 28``), or nothing at all (torch's
    zip writer: "unexpected pos 576 vs 534"); for the last, the partial files (at the
    process's file-size limit) or the folder's free space tell (read before they are
    removed)."""
    messages, seen, e = [], set(), err
    while e is not None and id(e) not in seen:  # the exception, its cause and its context, in turn
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e.errno
        messages.append(str(e))
        e = e.__cause__ or e.__context__
    text = " ".join(messages)
    for code in NO_SPACE:
        if f"errno = {code}," in text or f"os error {code})" in text:
            return code
    if not isinstance(err, (OSError, RuntimeError)):  # (a bad value, not a failed write)
        return None
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    try:
        written = [tmp] if tmp.is_file() else [p for p in tmp.rglob("*") if p.is_file()]
        if limit != resource.RLIM_INFINITY and any(p.stat().st_size >= limit for p in written):
            return errno.EFBIG
        return errno.ENOSPC if shutil.disk_usage(tmp.parent).free < FULL_BELOW else None
    except OSError:
        return None


def space_error(path: Path, tmp: Path, err: BaseException) -> DiskFull | None:
    """`DiskFull` for the failed write of ``path`` (into ``tmp``) when ``err`` came from a lack
    of space (see `_lack_of_space`), else None. Call it before removing the partial write."""
    code = _lack_of_space(err, tmp)
    if code is None:
        return None
    try:
        free = f"{shutil.disk_usage(path.parent).free} bytes free there"
    except OSError:
        free = "free space unknown"
    limit = " (the process's file-size limit, ulimit -f)" if code == errno.EFBIG else ""
    return DiskFull(code, f"{path}: not written: {os.strerror(code)}{limit} in {path.parent} ({free}); the partial "
                          "write was removed; make room and run the command again (it resumes)")


@contextlib.contextmanager
def _whole(path: Path, tmp: Path, commit: Callable[[], None]) -> Iterator[Path]:
    """Yield ``tmp``; ``commit`` it to ``path`` when the block ends without an error; remove it
    in any case (a file, or a folder with what it holds), raising `DiskFull` where the block
    failed for lack of space."""
    try:
        yield tmp
        commit()
    except Exception as err:
        full = space_error(path, tmp, err)
        if full is None:
            raise
        raise full from err
    finally:  # (gone after the commit)
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """Yield the temporary path to write ``path``'s contents to; on leaving the block without an
    error it is renamed to ``path`` (atomically, replacing an older file), and on an error it is
    removed and ``path`` is left as it was (`DiskFull` when the disk was full). The parent
    folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    with _whole(path, tmp, lambda: os.replace(tmp, path)) as out:
        yield out


@contextlib.contextmanager
def written_whole_folder(path: str | Path) -> Iterator[Path]:
    """`written_whole` for a folder: yield an empty temporary folder beside ``path`` to write
    the files into; on success it takes the place of ``path`` (an older folder there is moved
    aside first, then removed), on an error it is removed with what it holds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    shutil.rmtree(tmp, ignore_errors=True)  # what a process of the same pid left
    tmp.mkdir()

    def commit() -> None:
        if not path.exists():
            os.replace(tmp, path)
            return
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)

    with _whole(path, tmp, commit) as out:
        yield out


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping of the YAML file ``path`` (a run's ``config.yaml``), read safely (no tags that
    build objects); a file that is not YAML, or holds something else than a mapping, raises a
    one-line `ValueError` naming it (`FileNotFoundError` where it is missing)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable YAML configuration ({' '.join(str(err).split())[:300]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


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
