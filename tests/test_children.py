"""The benchmark drivers' child processes stop with the driver (`gno_ext._children`): a driver
killed alone (SIGTERM) or interrupted (SIGINT) passes the signal on to its runs and to their own
children, starts no further run, and exits with the signal's status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gno_ext import _children as children

from ._recipes import sigint_as_at_a_terminal

# a "training run": writes its pid, starts a child of its own (a data loader worker, say) that
# writes its pid too, and waits; on Ctrl-C it leaves a mark, as train.py keeps its checkpoint
RUN = textwrap.dedent("""
    import os, subprocess, sys, time
    out = sys.argv[1]
    sub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(out + ".grandchild", "w").write(str(sub.pid))
    open(out, "w").write(str(os.getpid()))
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        open(out + ".interrupted", "w").write("yes")
        sys.exit(130)
""")

# a driver: N runs, J at a time (J > 1: in worker threads, as compare_square.py runs them)
DRIVER = textwrap.dedent("""
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from gno_ext import _children as children
    run, folder, n, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    children.forward_signals()
    try:
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(lambda i: children.run([sys.executable, run, f"{folder}/run{i}"]), range(n)))
    except KeyboardInterrupt:
        sys.exit(130)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    return not (state.exists() and state.read_text().split(")")[-1].split()[0] == "Z")  # a zombie has ended


def _wait_for(paths: list[Path], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < end, f"not written: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def _start(tmp_path: Path, n: int, jobs: int) -> subprocess.Popen:
    (tmp_path / "run.py").write_text(RUN)
    (tmp_path / "driver.py").write_text(DRIVER)
    return subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "run.py"), str(tmp_path),
                             str(n), str(jobs)], preexec_fn=sigint_as_at_a_terminal)


def _pids(tmp_path: Path, runs: range) -> list[int]:
    return [int((tmp_path / f"run{i}{end}").read_text()) for i in runs for end in ("", ".grandchild")]


def _clean_up(driver: subprocess.Popen, tmp_path: Path) -> None:
    """Whatever a failed test left running is killed."""
    driver.kill()
    for path in tmp_path.glob("run[0-9]*"):
        if path.suffix in ("", ".grandchild") and path.read_text() and _alive(int(path.read_text())):
            os.kill(int(path.read_text()), signal.SIGKILL)


def _all_end(pids: list[int], timeout: float = 20.0) -> list[int]:
    end = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")
def test_a_killed_driver_ends_its_runs_and_their_children(tmp_path):
    driver = _start(tmp_path, n=1, jobs=1)
    try:
        _wait_for([tmp_path / "run0", tmp_path / "run0.grandchild"])
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=30) == 128 + signal.SIGTERM
        assert _all_end(_pids(tmp_path, range(1))) == []
    finally:
        _clean_up(driver, tmp_path)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")
def test_runs_in_threads_end_and_no_further_run_starts(tmp_path):
    driver = _start(tmp_path, n=4, jobs=2)
    try:
        _wait_for([tmp_path / f"run{i}{e}" for i in range(2) for e in ("", ".grandchild")])
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=30) == 128 + signal.SIGTERM
        assert _all_end(_pids(tmp_path, range(2))) == []
        assert not (tmp_path / "run2").exists() and not (tmp_path / "run3").exists()
    finally:
        _clean_up(driver, tmp_path)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")
def test_ctrl_c_reaches_the_runs_as_ctrl_c(tmp_path):
    """In its own process group a run does not get the terminal's Ctrl-C: the driver passes it
    on, as SIGINT, so that the run stops as an interrupted run does (its last checkpoint kept)."""
    driver = _start(tmp_path, n=2, jobs=2)
    try:
        _wait_for([tmp_path / f"run{i}{e}" for i in range(2) for e in ("", ".grandchild")])
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=30) == 130
        assert (tmp_path / "run0.interrupted").exists() and (tmp_path / "run1.interrupted").exists()
    finally:
        _clean_up(driver, tmp_path)


def test_run_returns_the_exit_status_and_the_captured_output():
    done = children.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                        capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    with pytest.raises(subprocess.CalledProcessError) as failed:
        children.run([sys.executable, "-c", "import sys; sys.exit(3)"], check=True)
    assert failed.value.returncode == 3


def test_signals_the_driver_was_started_ignoring_stay_ignored():
    """A background job starts with SIGINT ignored and `nohup` with SIGHUP ignored: the handlers
    leave those alone."""
    code = ("import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            "from gno_ext import _children as c; c.forward_signals()\n"
            "print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is c._forward)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]
