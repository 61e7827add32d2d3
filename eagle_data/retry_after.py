"""Reading a server's `Retry-After` header (a leaf: the engines sort errors with it, the runner waits on it)."""

from __future__ import annotations

from email.utils import parsedate_to_datetime

MAX_RETRY_AFTER_S = 600.0  # never trust a server to park us for longer than this


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds (fractions accepted) or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
