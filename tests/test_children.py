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


# a driver whose SIGTERM lands on one of its other threads (a process-directed signal may go to
# any thread that does not block it: torch's, a data loader's, a logger's)
THREAD_SIGNALLED_DRIVER = textwrap.dedent("""
    import os, signal, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from gno_ext import _children as children
    run, out = sys.argv[1], sys.argv[2]
    children.forward_signals()
    def signal_this_thread():
        while not (os.path.exists(out + ".grandchild") and os.path.exists(out) and open(out).read()):
            time.sleep(0.05)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Thread(target=signal_this_thread, daemon=True).start()
    if sys.argv[3] == "main":
        children.run([sys.executable, run, out])
    else:  # in a worker thread, the main thread waiting for the pool (as compare_square.py runs them)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(children.run, [sys.executable, run, out]).result()
""")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")
@pytest.mark.parametrize("run_in", ["main", "worker"])
def test_a_signal_taken_by_another_thread_still_ends_the_runs(tmp_path, run_in):
    """Python runs signal handlers in the main thread only: where the kernel gave SIGTERM to
    another thread, a main thread blocked in waiting for its run would pass it on only once the
    run had ended by itself. The run must be ended by the signal instead."""
    (tmp_path / "run.py").write_text(RUN)
    (tmp_path / "driver.py").write_text(THREAD_SIGNALLED_DRIVER)
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "run.py"),
                               str(tmp_path / "run0"), run_in])
    try:
        _wait_for([tmp_path / "run0", tmp_path / "run0.grandchild"])
        assert driver.wait(timeout=30) == 128 + signal.SIGTERM
        assert _all_end(_pids(tmp_path, range(1))) == []
    finally:
        _clean_up(driver, tmp_path)


# a driver that forks (a data loader's worker, say) while its run goes on; the forked process
# gets SIGTERM and ends
FORKING_DRIVER = textwrap.dedent("""
    import os, signal, sys, threading, time, warnings
    from gno_ext import _children as children
    run, out = sys.argv[1], sys.argv[2]
    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
    children.forward_signals()
    def fork_and_signal_the_fork():
        while not (os.path.exists(out) and open(out).read()):
            time.sleep(0.05)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except SystemExit as stop:  # the handler it inherited
                code = stop.code
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        time.sleep(1.0)  # time enough for a TERM passed on by mistake to reach the run
        stat = f"/proc/{open(out).read()}/stat"
        alive = os.path.exists(stat) and open(stat).read().split(")")[-1].split()[0] != "Z"  # Z: ended, not reaped
        open(out + ".fork", "w").write(f"{os.waitstatus_to_exitcode(status)} {alive}")
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=fork_and_signal_the_fork, daemon=True).start()
    children.run([sys.executable, run, out])
    time.sleep(30)  # the run ended otherwise than by the driver's TERM: stay to report it
""")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="os.fork and /proc")
def test_a_signal_to_a_forked_process_stays_there(tmp_path):
    """A process forked from the driver inherits its handlers and its wakeup pipe: its SIGTERM
    ends it and must not reach the driver's runs."""
    (tmp_path / "run.py").write_text(RUN)
    (tmp_path / "driver.py").write_text(FORKING_DRIVER)
    out = tmp_path / "run0"
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "run.py"), str(out)])
    try:
        _wait_for([out, tmp_path / "run0.grandchild"])
        _wait_for([tmp_path / "run0.fork"], timeout=30)
        fork_status, run_alive = (tmp_path / "run0.fork").read_text().split()
        assert fork_status == str(128 + signal.SIGTERM)
        assert run_alive == "True", "the forked process's SIGTERM reached the driver's run"
        assert driver.wait(timeout=30) == 128 + signal.SIGTERM  # the driver's own TERM still ends it and its run
        assert _all_end(_pids(tmp_path, range(1))) == []
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


# a run that takes a moment to stop (as a training run saving its checkpoint), and a driver that
# tidies up after it (as benchmark.py puts back the result files it set aside)
SLOW_STOP = textwrap.dedent("""
    import os, signal, sys, time
    out = sys.argv[1]
    def stop(signum, frame):
        time.sleep(1.0)
        open(out + ".stopped", "w").write("yes")
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    open(out, "w").write(str(os.getpid()))
    time.sleep(120)
""")
TIDY_DRIVER = textwrap.dedent("""
    import os, sys
    from gno_ext import _children as children
    run, out = sys.argv[1], sys.argv[2]
    children.forward_signals()
    try:
        children.run([sys.executable, run, out])
    finally:
        open(out + ".tidied", "w").write(str(os.path.exists(out + ".stopped")))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")
def test_a_repeated_signal_lets_the_driver_finish_stopping(tmp_path):
    """SIGTERM twice in a row (`timeout` signals the command and then its process group; a trap
    passes it on again): the driver still waits for its run to stop and then tidies up, and
    exits with the first signal's status and no traceback."""
    (tmp_path / "run.py").write_text(SLOW_STOP)
    (tmp_path / "driver.py").write_text(TIDY_DRIVER)
    out = tmp_path / "run0"
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "run.py"), str(out)],
                              stderr=subprocess.PIPE, text=True)
    try:
        _wait_for([out])
        driver.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # while the run is stopping
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=30)
        assert driver.returncode == 128 + signal.SIGTERM
        assert (tmp_path / "run0.stopped").exists()
        assert (tmp_path / "run0.tidied").read_text() == "True", "tidied up before its run had stopped"
        assert "Traceback" not in err, err
    finally:
        driver.kill()
        if out.exists() and out.read_text() and _alive(int(out.read_text())):
            os.kill(int(out.read_text()), signal.SIGKILL)


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
            "print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is c._stop)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]
