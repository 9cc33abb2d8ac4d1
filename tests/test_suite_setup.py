"""The suite's own set-up (tests/conftest.py): CPU threads per pytest-xdist process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import threads_per_process

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("cores", "processes", "share"), [(16, 11, 1), (16, 4, 4), (128, 12, 10), (2, 8, 1),
                                                          (2, 1, 2)])
def test_threads_per_process(cores, processes, share):
    assert threads_per_process(cores, processes) == share


def _threads_in_a_worker(**env) -> list[str]:
    """(intra-op threads, inductor's compile threads) after the set-up, in a fresh interpreter
    with ``env`` added to the environment (without OMP_NUM_THREADS unless given)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS", "PYTEST_XDIST_WORKER_COUNT")}
    code = ("import tests.conftest, torch, torch._inductor.config as c; "
            "print(torch.get_num_threads(), c.compile_threads)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


@pytest.mark.slow
def test_xdist_processes_share_the_cores():
    cores = len(os.sched_getaffinity(0))
    share = str(max(1, cores // 64))
    assert _threads_in_a_worker(PYTEST_XDIST_WORKER_COUNT="64") == [share, share]


@pytest.mark.slow
def test_explicit_thread_settings_win():
    # one process alone would get every core; the explicit settings say one thread
    assert _threads_in_a_worker(PYTEST_XDIST_WORKER_COUNT="1", OMP_NUM_THREADS="1",
                                TORCHINDUCTOR_COMPILE_THREADS="1") == ["1", "1"]


@pytest.mark.slow
def test_without_xdist_torch_keeps_its_default():
    threads, _ = _threads_in_a_worker()
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTEST_XDIST_WORKER_COUNT")}
    alone = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=base,
                           capture_output=True, text=True, check=True)
    assert threads == alone.stdout.strip()
