"""Whole-or-nothing file writes: a file is written under a temporary name beside its target and
renamed onto it only when the write ends without an error, so a reader (or a resumed job) never
sees a half-written dataset, manifest or result."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


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
