"""Reading a server's `Retry-After` header (a leaf: the engines sort errors with it, the runner waits on it)."""

from __future__ import annotations

from email.utils import parsedate_to_datetime


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds (fractions accepted) or an HTTP date. Not
    capped here: the runner caps the wait (`max_retry_wait_s`) and says so when the server asked for more."""
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
    return max(seconds, 0.0)
