"""How many torch threads the embedded engine may use without oversubscribing the machine.

A torch (OpenMP) thread whose core is taken by another process spins at its barrier while the others wait for
it: on a busy 2-core machine two threads made a quarter of one thread's tokens per CPU-second
(docs/engines.md, "The local engine"). So the count is the CPUs this process may run on (its affinity) less
what other processes keep busy on them, measured from /proc/stat over the last window with this process's own
CPU time taken out, and never below 1. Where /proc/stat cannot be read (not Linux) it is 1. Every forward
pass this process runs on the CPU takes its count so (`torch_threads`): the embedded engine's batches, the
on-policy scorer's and the hidden-state capture's.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
FREE_ENOUGH = 0.75  # a CPU counts as free when other processes leave at least this share of it idle
WINDOW_S = 0.5  # the shortest window a new count is judged over; shorter ones keep the last count
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle and iowait left out)


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity where the system says, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def busy_cpu_seconds(cpus: frozenset[int], stat: Path = PROC_STAT) -> float | None:
    """CPU seconds spent busy on `cpus` since boot, every process together; None where /proc/stat is unreadable."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks += sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields))
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_count(cpus: int, others_busy: float) -> int:
    """The rule: one thread per CPU that other processes leave free enough, at least 1, at most `cpus`."""
    return max(1, min(cpus, math.floor(cpus - others_busy + (1 - FREE_ENOUGH))))


@dataclass
class _Look:
    wall: float
    busy: float | None
    own: float


def _look(cpus: frozenset[int]) -> _Look:
    return _Look(time.monotonic(), busy_cpu_seconds(cpus), time.process_time())


class ThreadMeter:
    """The thread count for the next batch, from what other processes did on this process's CPUs since the
    last count (this process's own CPU time, every thread of it, taken out)."""

    def __init__(self) -> None:
        self.cpus = usable_cpus()
        self._last = _look(self.cpus)
        self.others_busy: float | None = None  # CPUs other processes kept busy over the last window
        self.threads = 1

    def count(self) -> int:
        """A new count once a window of at least WINDOW_S has passed (the first one waits for it), else the
        last; 1 where the load cannot be read."""
        now = _look(self.cpus)
        if now.wall - self._last.wall < WINDOW_S:
            if self.others_busy is not None:
                return self.threads
            time.sleep(WINDOW_S - (now.wall - self._last.wall))
            now = _look(self.cpus)
        last, self._last = self._last, now
        if now.busy is None or last.busy is None:
            return self.threads
        others = (now.busy - last.busy) - (now.own - last.own)
        self.others_busy = max(0.0, others / (now.wall - last.wall))
        self.threads = thread_count(len(self.cpus), self.others_busy)
        return self.threads


_METER: tuple[int, ThreadMeter] | None = None
_METER_LOCK = threading.Lock()


def process_meter() -> ThreadMeter:
    """This process's meter (a forked child starts its own: the parent's window is not its own)."""
    global _METER
    if _METER is None or _METER[0] != os.getpid():
        _METER = (os.getpid(), ThreadMeter())
    return _METER[1]


def metered_count() -> int:
    """The process meter's count (its threads: the engine's worker, a step's main thread)."""
    with _METER_LOCK:
        return process_meter().count()


def retune() -> None:
    """Inside `torch_threads()` with no count given: the meter's count for what this thread computes next (a new
    look once a window has passed), so a long batch follows the machine's load, not only its load at the start."""
    import torch

    if (count := metered_count()) != torch.get_num_threads():
        torch.set_num_threads(count)


@contextmanager
def torch_threads(count: int | None = None) -> Iterator[None]:
    """torch's intra-op thread count for this block: `count`, or (None) the process meter's; restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count or metered_count())
    try:
        yield
    finally:
        torch.set_num_threads(before)
