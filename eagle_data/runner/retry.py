"""Retry policy as small pure functions: which errors to retry, how long to wait, when to give up.

The engine sorts failures into `RetryableError` (with `kind`, `retry_after`, `throttle`) and
`FatalError`; this module only decides. Randomness comes in as an argument so tests are exact.
"""

from __future__ import annotations

import random

from eagle_data.runner.settings import RunnerSettings
from eagle_data.types import EngineError, FatalError, RetryableError

JITTER_SHARE = 0.5  # "equal jitter": wait between half and all of the exponential delay


def backoff_delay(attempt: int, base_s: float, cap_s: float, rand: float) -> float:
    """Delay before attempt `attempt + 1` (attempt counts from 1); `rand` is uniform in [0, 1)."""
    full = min(cap_s, base_s * 2 ** (attempt - 1))
    return full * (1 - JITTER_SHARE) + full * JITTER_SHARE * rand


def should_retry(error: EngineError, attempts: int, throttle_waits: int, settings: RunnerSettings) -> bool:
    """Another attempt? Fatal never; throttling within its own allowance; the rest within max_attempts.

    `attempts` counts non-throttle attempts made so far, `throttle_waits` the throttled ones.
    """
    if isinstance(error, FatalError) or not isinstance(error, RetryableError):
        return False
    if error.throttle:
        return throttle_waits <= settings.max_throttle_waits
    return attempts < settings.max_attempts


def retry_delay(error: RetryableError, attempt: int, settings: RunnerSettings, rng: random.Random) -> float:
    """Wait before the next attempt: the server's Retry-After if longer than our own backoff."""
    delay = backoff_delay(attempt, settings.backoff_base_s, settings.backoff_cap_s, rng.random())
    return max(delay, error.retry_after or 0.0)
