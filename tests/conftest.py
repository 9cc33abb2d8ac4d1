"""Suite-wide set-up: CPU threads per process when pytest-xdist spreads the tests.

Each process of ``pytest -n N`` would otherwise start as many intra-op threads as the machine
has cores (and inductor as many compile workers), ``N`` times over. On a 16-core GPU machine
with 11 processes, CPU tests that take 2 s alone ran for more than 400 s (and on this
project's 2-core machine, 16 threads in each of 2 processes made 11 of them take 107.9 s
instead of 8.5 s).
So each process gets its share of the cores, unless ``OMP_NUM_THREADS`` (or
``TORCHINDUCTOR_COMPILE_THREADS``) says otherwise.
"""

from __future__ import annotations

import os

import torch


def threads_per_process(cores: int, processes: int) -> int:
    """Each of ``processes`` processes' share of ``cores`` cores, at least one."""
    return max(1, cores // max(1, processes))


def _share_cores() -> None:
    processes = os.environ.get("PYTEST_XDIST_WORKER_COUNT")  # set in xdist's worker processes only
    if processes is None:
        return
    share = threads_per_process(len(os.sched_getaffinity(0)), int(processes))
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(share)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(share))


_share_cores()
