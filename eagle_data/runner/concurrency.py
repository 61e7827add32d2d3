"""Adaptive in-flight limit (AIMD) shared by every shard of a run, with a server-imposed pause.

Slow start doubles the limit each round trip (+1 per success) from a low start until the first
throttle; then it halves and grows by `GROWTH` of itself (at least `AI_STEP`) per round trip, so a
transient burst costs minutes of ramp, not the hours plain +1/RTT would take at 2,000 in flight.
Throttles from requests sent before the last cut do not cut again, so one 429 burst halves the
limit once, not 2,000 times.
A Retry-After pauses every new send until it has passed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

DECREASE_FACTOR = 0.5
AI_STEP = 8.0  # least increase per round trip once past the slow-start threshold
GROWTH = 0.1  # increase per round trip past the threshold, as a share of the limit


class AdaptiveLimiter:
    """A semaphore whose size follows AIMD; `epoch` counts cuts (read it when sending)."""

    def __init__(self, initial: int, minimum: int, maximum: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = float(initial)
        self.minimum, self.maximum = minimum, maximum
        self.slow_start_until = float(maximum)
        self.in_flight = 0
        self.epoch = 0
        self.cuts = 0
        self.paused_until = 0.0
        self._clock = clock
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def current(self) -> int:
        return int(self.limit)

    async def acquire(self) -> None:
        if self.in_flight < self.current and not self._waiters:
            self.in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # release() hands its slot over: in_flight already counts us
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()
            raise

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.current:
            fut = self._waiters.popleft()
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)

    async def wait_unpaused(self) -> None:
        """Sleep while a server-requested pause (Retry-After) is in force."""
        while (left := self.paused_until - self._clock()) > 0:
            await asyncio.sleep(left)

    def on_success(self) -> None:
        step = 1.0 if self.limit < self.slow_start_until else max(AI_STEP, GROWTH * self.limit) / self.limit
        self.limit = min(float(self.maximum), self.limit + step)
        self._wake()

    def on_throttle(self, sent_epoch: int, retry_after: float | None) -> None:
        """The server said slow down. Cut once per epoch; pause all sends for Retry-After."""
        if retry_after:
            self.paused_until = max(self.paused_until, self._clock() + retry_after)
        if sent_epoch == self.epoch:
            self.limit = max(float(self.minimum), self.limit * DECREASE_FACTOR)
            self.slow_start_until = self.limit
            self.epoch += 1
            self.cuts += 1
