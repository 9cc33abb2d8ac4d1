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
            signal.signal(sig, _forward)


def _forward(signum: int, frame: Any) -> None:
    with _lock:
        repeated = bool(_stopped_by)
        if not repeated:
            _stopped_by.append(signum)
        children = list(_live.values())
    for proc in children:
        _signal_group(proc, signum)
    if repeated:  # already stopping: an exception here would break off its waiting or its clean-up
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """``signum`` to the child's process group (its own pid), unless it has already ended."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:  # ended meanwhile
            pass
