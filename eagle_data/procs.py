"""Which process runs a job, and whether it still does: enough to tell a killed run from a busy one.

A worker is named `host:pid`. On the host that wrote the name, `os.kill(pid, 0)` answers whether it
still exists (a zombie, killed but not yet reaped by its parent, counts as gone); on another host
nothing here can tell, and callers must leave such a worker alone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time
from enum import Enum
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_S = 0.25  # how often a forkserver step checks that its run worker lives (one /proc read)


class Liveness(Enum):
    ALIVE = "alive"
    GONE = "gone"
    UNKNOWN = "unknown"  # another host, or not a worker name


def worker_id(pid: int | None = None) -> str:
    """`host:pid` of this process (or of `pid` on this host)."""
    return f"{socket.gethostname()}:{pid or os.getpid()}"


def liveness(worker: str) -> Liveness:
    host, _, pid_text = worker.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return Liveness.UNKNOWN
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Liveness.GONE
    except PermissionError:  # exists, owned by another user
        return Liveness.ALIVE
    return Liveness.GONE if _zombie(pid) else Liveness.ALIVE


def _zombie(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] == "Z"  # no procfs (macOS): trust kill(0)


def die_with(worker_pid: int) -> bool:
    """End this process with a SIGKILL when `worker_pid` dies (Linux only), so a process whose orchestrator
    was killed stops paying for requests nobody will record. `worker_pid` is this process's parent
    (multiprocessing's spawn): the kernel signals this process when its parent exits (PDEATHSIG). Or it is
    the parent of this process's parent, a forkserver: a forkserver outlives the process that started it as
    long as any process it forked lives (each holds its "alive" pipe open), so a thread here watches the
    forkserver: when the worker dies it is re-parented. Returns whether the tie is in place: not when the
    worker is gone already (the caller checks), except that a spawned process whose parent died during the
    tie exits at once."""
    if sys.platform != "linux":
        return False
    parent = os.getppid()
    if parent == worker_pid:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
        if os.getppid() != parent:  # died between the check and the prctl call
            os.kill(os.getpid(), signal.SIGKILL)
        return True
    if _parent(parent) != worker_pid:
        return False
    threading.Thread(target=_kill_self_when_orphaned, args=(parent, worker_pid), name="die_with", daemon=True).start()
    return True


def _kill_self_when_orphaned(forkserver: int, worker_pid: int) -> None:
    while _parent(forkserver) == worker_pid:  # a dead worker's children are re-parented (or the server is gone)
        time.sleep(WATCH_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _parent(pid: int) -> int | None:
    stat = _stat(pid)
    return int(stat[1]) if stat else None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, parent, ...), or None without one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
