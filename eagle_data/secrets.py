"""Keeping secrets out of logs, errors, metadata and files: URL credentials and API key values.

One home for both: every place that shows a URL passes it through `mask_url`, and every engine
passes server error text through `redact` before it becomes an exception message (which the runner
logs and stores in the shard's `error` column).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import SplitResult, urlsplit

MASK = "***"
MIN_SECRET_CHARS = 4  # shorter values would blank out ordinary words


def url_parts(url: str) -> SplitResult | None:
    """`url` split, or None when it is not an absolute http(s) URL with a host."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts


def mask_url(url: str) -> str:
    """`url` with its password (and user name) replaced by ***, for anything shown or stored."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK if "@" in url else url
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=f"{MASK}@{parts.netloc.rsplit('@', 1)[1]}").geturl()


def strip_credentials(url: str) -> tuple[str, str, str]:
    """(url without user info, user, password); user and password are "" when the URL carries none."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, "", ""
    clean = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()
    return clean, parts.username or "", parts.password or ""


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every given secret value replaced by ***."""
    for secret in secrets:
        if len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, MASK)
    return text
