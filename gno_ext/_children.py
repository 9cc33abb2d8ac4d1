"""Child processes that stop with the command that started them.

The benchmark drivers (`recipes/benchmark.py run`, `benchmarks/compare_square.py run`, the
`bench_*` scripts) start their training runs as child processes. A driver killed alone (`kill
PID`, `timeout 2h python recipes/benchmark.py run ...`, a job manager that signals the process it
started) would otherwise leave its runs training on, orphaned, on the GPUs. Here each child
goes into a process group of its own (`run`), and `forward_signals` makes the driver pass
SIGTERM, SIGINT and SIGHUP on to every child's group (the child's own children with it: a sweep's
training runs, their data loader workers, `torchrun`'s processes) before it stops itself: Ctrl-C
interrupts the runs as it interrupts one (each keeps its last checkpoint), SIGTERM ends them.
A signal the driver was started ignoring (SIGINT in a background job, SIGHUP under `nohup`)
stays ignored, as the shell meant. After the first signal no new child is started, and a
repeated one (`timeout` signals the command and then its whole process group, SLURM every
process of a job step, a script's trap passes it on again) goes on to the children but does not
cut short the driver's own stop under way: its waiting for the runs and its clean-up (putting
back the result files a refresh had set aside, say).

The kernel may hand a process-directed signal to any of the driver's threads (torch's, a worker
thread's), while Python runs its handlers in the main thread only, and only between bytecodes: a
main thread blocked in waiting for a run would pass the signal on only once that run had ended by
itself. So the signals are passed on by a thread of their own, woken through
`signal.set_wakeup_fd` whichever thread took them; the main thread's handler only stops the
driver. (Where something else, an event loop, already owns the wakeup fd, the handler passes
them on itself, as far as it can.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["forward_signals", "run"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_lock = threading.RLock()  # re-entrant: the handler may run in the main thread while it holds the lock
_live: dict[int, subprocess.Popen] = {}  # the running children, by pid
_stopped_by: list[int] = []  # the signal that stopped this process, once one has (it went to every live child:
# none starts after it)
_handled: list[int] = []  # the signals the main thread's handler has seen (it raises for the first only)
_watcher: dict[str, Any] = {}  # the wakeup pipe's ends ("fds"), once the thread that passes signals on has started


def run(command: Sequence[str], *, check: bool = False, **popen: Any) -> subprocess.CompletedProcess:
    """Run ``command`` to its end in a process group of its own and return what
    `subprocess.run` would (``stdout``/``stderr`` where ``popen`` pipes them, or has
    ``capture_output=True``; `subprocess.CalledProcessError` for a non-zero exit with
    ``check=True``). Where the waiting
    is interrupted otherwise than by a forwarded signal (an error), the child's group is sent
    SIGTERM; either way the child is waited for before the exception goes on. Raises `SystemExit`
    instead of starting the child once a forwarded signal has arrived."""
    if popen.pop("capture_output", False):
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    proc = None
    try:
        with _lock:
            if _stopped_by:
                raise SystemExit(128 + _stopped_by[0])
            proc = subprocess.Popen(list(command), **group, **popen)
            _live[proc.pid] = proc
        out, err = proc.communicate()
    except BaseException:
        if proc is not None:
            if not _stopped_by:  # else the handler has passed its signal on
                _signal_group(proc, signal.SIGTERM)
            proc.wait()
        raise
    finally:
        if proc is not None:
            with _lock:
                _live.pop(proc.pid, None)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def forward_signals() -> None:
    """Install, in the main thread, the handlers that pass SIGTERM, SIGINT and SIGHUP on to the
    process groups of the children that `run` started, then stop this process: `KeyboardInterrupt`
    for SIGINT, `SystemExit` with status 128 + the signal's number for the others. A signal after
    the first is passed on alone, raising nothing: the stop that the first began finishes. Signals
    this process ignores are left ignored."""
    for sig in FORWARDED:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _stop)
    _start_watcher()


def _start_watcher() -> None:
    """The thread that passes each forwarded signal on as soon as it arrives: the signal module's
    C handler writes the signal's number into a pipe, whichever thread the kernel chose."""
    if _watcher:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # as set_wakeup_fd requires: a full pipe drops a byte, never blocks
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if previous != -1:  # another owner's (an event loop's): leave it theirs and pass signals on in the handler
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return
    _watcher["fds"] = (read_end, write_end)
    threading.Thread(target=_watch, args=(read_end,), name="gno_ext-forward-signals", daemon=True).start()


def _watch(read_end: int) -> None:
    while numbers := os.read(read_end, 64):
        for signum in numbers:
            if signum in FORWARDED:
                _pass_on(signum)


def _pass_on(signum: int) -> None:
    """``signum`` to every running child's group; the first such signal stops new children."""
    with _lock:
        if not _stopped_by:
            _stopped_by.append(signum)
        children = list(_live.values())
    for proc in children:
        _signal_group(proc, signum)


def _stop(signum: int, frame: Any) -> None:
    """The main thread's handler: stops this process at the first signal (the watcher has passed
    it on, or passes it on now), lets a later one go by."""
    with _lock:
        repeated = bool(_handled)
        _handled.append(signum)
        if not _stopped_by:
            _stopped_by.append(signum)
    if not _watcher:
        _pass_on(signum)
    if repeated:  # already stopping: an exception here would break off its waiting or its clean-up
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _after_fork_in_child() -> None:
    """A forked child (a data loader's worker) has none of its parent's children, nor its watcher
    thread; the wakeup pipe it inherited would carry its signals to the parent's watcher."""
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork
    _live.clear()
    if _watcher:
        signal.set_wakeup_fd(-1)  # allowed: the thread that forked is the child's main thread
        for fd in _watcher.pop("fds"):
            os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """``signum`` to the child's process group (its own pid), unless it has already ended."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:  # ended meanwhile
            pass
