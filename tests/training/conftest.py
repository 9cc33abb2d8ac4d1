"""Shared fixtures of the recipe tests: a data cache, external-layout files, and a runner."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from gno_ext.adapters.fixtures import write_pdebench_cfd, write_pdebench_tensor, write_trl_dataset
from tests._recipes import load_recipe

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PY = ROOT / "recipes" / "train.py"


def load_train_module():
    return load_recipe("train")


@pytest.fixture(scope="session")
def train_module():
    return load_train_module()


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    """One generated-data cache for the whole session (presets are generated on first use)."""
    return tmp_path_factory.mktemp("gno_cache")


@pytest.fixture(autouse=True)
def _use_cache(cache, monkeypatch):
    monkeypatch.setenv("GNO_EXT_CACHE", str(cache))


@pytest.fixture(scope="session")
def trl_root(tmp_path_factory) -> Path:
    """The Well's turbulent_radiative_layer_2D in its published layout (few trajectories and frames)."""
    return write_trl_dataset(tmp_path_factory.mktemp("the_well"), n=2, t=8)


@pytest.fixture(scope="session")
def pdebench_root(tmp_path_factory) -> Path:
    """PDEBench files for the pdebench-* recipes, two parameter values each, ten trajectories."""
    root = tmp_path_factory.mktemp("pdebench")
    for i, beta in enumerate((0.1, 1.0)):
        write_pdebench_tensor(root / f"1D_Advection_Sols_beta{beta}.hdf5", n=10, t=8, x=32, seed=i)
    for i, nu in enumerate((0.001, 0.1)):
        write_pdebench_tensor(root / f"1D_Burgers_Sols_Nu{nu}.hdf5", n=10, t=8, x=32, seed=10 + i)
    for i, m in enumerate((0.1, 1.0)):
        write_pdebench_cfd(root / f"2D_CFD_Rand_M{m}_Eta0.01_Zeta0.01_periodic_16_Train.hdf5", n=10, t=6, x=16, y=8,
                           seed=20 + i)
    return root


def env_with_cache(cache: Path) -> dict[str, str]:
    env = dict(os.environ, GNO_EXT_CACHE=str(cache), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


PYTHON = sys.executable


def free_port() -> int:
    """A TCP port that is free now (for torchrun's rendezvous: a fixed port can be held by
    another run on the same machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from /proc; none where there is no /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def torchrun(nproc: int, args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node nproc args`` on a free port, its output
    captured. On a timeout every worker still running gets SIGABRT, on which Python's fault
    handler (enabled here) writes each thread's stack to the output, so the test's failure shows
    where the workers waited; then the launcher gets SIGTERM, on which it stops its workers
    (they run in sessions of their own, so killing the launcher outright would leave them
    waiting in a collective for ever), then SIGKILL, and the test fails with the output so far."""
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(free_port()),
           *args]
    proc = subprocess.Popen(cmd, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = _children(proc.pid)
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish within {timeout} s (workers {workers} were sent SIGABRT for their "
                    f"stacks): {' '.join(cmd)}\n{err[-12000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


QUIET = ["trainer.progress=false", "trainer.tensorboard=false"]  # recipe overrides for quiet test runs


def run_weights(run: Path) -> dict[str, torch.Tensor]:
    """The final model weights of a training run folder."""
    return safetensors.torch.load_file(str(run / "model" / "model.safetensors"))


def run_metrics(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    """The rows of a training run folder's ``metrics.jsonl`` (or of its file ``name`` of the same
    form, such as the rows a resume moved aside)."""
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def logged(run: Path, key: str) -> list:
    """The values of ``key`` in a run's logged rows, in order (rows without it left out)."""
    return [row[key] for row in run_metrics(run) if key in row]


@pytest.fixture(scope="session")
def custom_file(tmp_path_factory) -> Path:
    """A user's own trajectories in an .npz (the names of gno_ext.adapters.custom)."""
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("custom") / "my_runs.npz"
    u = rng.standard_normal((10, 8, 2, 16, 16)).astype(np.float32)
    np.savez(path, u=u, theta=np.linspace(0.5, 2.0, 10, dtype=np.float32)[:, None], dt=np.float32(0.1))
    return path
