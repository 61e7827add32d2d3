"""Alerts as Slack incoming-webhook messages: pure payload builders and one bounded POST.

Open-source Dagster does not announce failed checks; the sensors in eagle_data/defs/sensors.py call
these. The webhook URL is a secret (it is the credential): it comes only from $EAGLE_DATA_ALERT_WEBHOOK
and never appears in a log line, an exception message or metadata.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from eagle_data import settings
from eagle_data.types import UserError

WEBHOOK_ENV = "EAGLE_DATA_ALERT_WEBHOOK"
DEFAULT_TIMEOUT_S = 10.0
_MAX_TEXT = 2900  # Slack rejects section text over 3,000 characters
_MAX_HEADER = 150  # and header text over 150

Payload = dict[str, Any]


class AlertError(UserError, RuntimeError):
    """The webhook could not be reached or refused the message; the message never holds the URL."""


def webhook_url() -> str | None:
    """The configured webhook URL, or None when alerts are off."""
    return settings.get(WEBHOOK_ENV) or None


def run_link(base_url: str, run_id: str) -> str:
    """Where the run is in the Dagster UI."""
    return f"{base_url.rstrip('/')}/runs/{run_id}"


def asset_link(base_url: str, asset: str, check: str | None = None) -> str:
    """Where the asset (or one of its checks) is in the Dagster UI: `/assets/<key>?view=checks&checkDetail=<name>`
    is the address the UI itself builds for a check (dagster-webserver 1.13)."""
    page = f"{base_url.rstrip('/')}/assets/{urllib.parse.quote(asset, safe='')}"
    return f"{page}?{urllib.parse.urlencode({'view': 'checks', 'checkDetail': check})}" if check else page


# "dagster._core.definitions.events.Failure: ", "eagle_data.sources.SourceError: ": where an exception came
# from matters to a developer reading the run's log, not to the person reading the alert.
_CLASS_PATH = re.compile(r"^(?:[A-Za-z_]\w*\.)+[A-Z]\w*:\s*")


def readable(error: str) -> str:
    """The first line of an error, without the Python class path in front of it."""
    first_line = (error.strip().splitlines() or [""])[0]
    while (stripped := _CLASS_PATH.sub("", first_line, count=1)) != first_line:
        first_line = stripped
    return first_line or "(no error message)"


def _mrkdwn(text: str, limit: int = _MAX_TEXT) -> str:
    """Escape Slack's control characters and keep within its size limit."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.4g}"


def _payload(headline: str, body: str, fields: dict[str, str], links: dict[str, str]) -> Payload:
    where = " ".join(f"{name}: {url}" for name, url in links.items())
    return {
        "text": f"{_mrkdwn(headline)}: {_mrkdwn(body)} ({where})",  # notifications, and non-Slack receivers
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": headline[:_MAX_HEADER]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(body)}},
            {
                "type": "section",
                "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{_mrkdwn(v, 1900)}"} for k, v in fields.items()],
            },
            {"type": "section", "text": {"type": "mrkdwn", "text": " · ".join(f"<{u}|{n}>" for n, u in links.items())}},
        ],
    }


@dataclass(frozen=True)
class CheckFailure:
    """One failed check evaluation, as plain values: a range run reports one per shard, or one for the
    whole range (then `shards` lists the shards that failed)."""

    run_id: str
    dataset: str
    asset: str
    check: str
    severity: str
    shards: tuple[str, ...]
    message: str
    figure: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class CheckAlert:
    """What one alert says: every failure of one check in one run."""

    run_id: str
    dataset: str
    asset: str
    check: str
    severity: str
    failures: tuple[CheckFailure, ...]

    @property
    def shards(self) -> list[str]:
        return sorted({shard for f in self.failures for shard in f.shards})


def group_failures(failures: Iterable[CheckFailure]) -> list[CheckAlert]:
    """One alert per (run, asset, check), in the order their first failure came."""
    groups: dict[tuple[str, str, str], list[CheckFailure]] = {}
    for f in failures:
        groups.setdefault((f.run_id, f.asset, f.check), []).append(f)
    return [
        CheckAlert(run_id, fs[0].dataset, asset, check, fs[0].severity, tuple(fs))
        for (run_id, asset, check), fs in groups.items()
    ]


def _where(dataset: str, asset: str | None) -> str:
    """ "b7_sharegpt (b7_sharegpt_validated)": the dataset, and the asset where it is not the dataset itself."""
    return f"{dataset} ({asset})" if asset and asset != dataset else dataset


def _shard_list(shards: Sequence[str], limit: int = 12) -> str:
    more = f" and {len(shards) - limit} more" if len(shards) > limit else ""
    return ", ".join(shards[:limit]) + more


def check_alert(alert: CheckAlert, base_url: str) -> Payload:
    """A failed check: dataset, asset, check, the failing shards, the first shard's figure against the
    threshold and message, links to the check and the run."""
    first, shards = alert.failures[0], alert.shards
    on = f" [{_shard_list(shards, 3)}]" if shards else ""
    body = readable(first.message)
    if len(alert.failures) > 1:
        body += f" (and {len(alert.failures) - 1} more shard(s); each shard's figures are on the check page)"
    fields = {
        "Dataset": alert.dataset,
        "Asset": alert.asset,
        "Check": f"{alert.check} ({alert.severity})",
        "Failing shards": _shard_list(shards) if shards else "(all)",
    }
    if first.figure is not None or first.threshold is not None:  # a check judging no one figure says so in words
        fields["Figure vs threshold"] = f"{_figure(first.figure)} vs {_figure(first.threshold)}"
    return _payload(
        f"{alert.severity} check {alert.check} failed on {_where(alert.dataset, alert.asset)}{on}",
        body,
        {**fields, "Run": alert.run_id},
        {
            "Open the check": asset_link(base_url, alert.asset, alert.check),
            "Open the run": run_link(base_url, alert.run_id),
        },
    )


def run_alert(
    *,
    job: str,
    run_id: str,
    base_url: str,
    error: str,
    dataset: str | None = None,
    asset: str | None = None,
    partition: str | None = None,
) -> Payload:
    """A failed run: which dataset, asset and partition (the job when none is known), the first error line
    without its class path, links to the asset and the run."""
    what = _where(dataset, asset) if dataset else asset or job
    links = {"Open the asset": asset_link(base_url, asset)} if asset else {}
    return _payload(
        f"Run failed: {what}" + (f" [{partition}]" if partition else ""),
        readable(error),
        {"Dataset": dataset or "(n/a)", "Asset": asset or "(n/a)", "Partition": partition or "(n/a)", "Job": job},
        {**links, "Open the run": run_link(base_url, run_id)},
    )


def post_alert(payload: Payload, url: str, timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """POST the payload as JSON; returns the HTTP status, raises AlertError (without the URL)."""
    try:
        request = urllib.request.Request(
            url,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        raise AlertError(f"alert webhook answered HTTP {exc.code} (check ${WEBHOOK_ENV})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        why = getattr(reason, "strerror", None) or type(reason).__name__
        raise AlertError(f"alert webhook unreachable: {why} (check ${WEBHOOK_ENV})") from None
    except ValueError:  # urllib's own message quotes the URL
        raise AlertError(f"alert webhook URL is malformed (check ${WEBHOOK_ENV})") from None
