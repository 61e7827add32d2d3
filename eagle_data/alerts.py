"""Alerts as Slack incoming-webhook messages: pure payload builders and one bounded POST.

Open-source Dagster does not announce failed checks; the sensors in eagle_data/defs/sensors.py call
these. The webhook URL is a secret (it is the credential): it comes only from $EAGLE_DATA_ALERT_WEBHOOK
and never appears in a log line, an exception message or metadata.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from eagle_data import settings

WEBHOOK_ENV = "EAGLE_DATA_ALERT_WEBHOOK"
DEFAULT_TIMEOUT_S = 10.0
_MAX_TEXT = 2900  # Slack rejects section text over 3,000 characters
_MAX_HEADER = 150  # and header text over 150

Payload = dict[str, Any]


class AlertError(RuntimeError):
    """The webhook could not be reached or refused the message; the message never holds the URL."""


def webhook_url() -> str | None:
    """The configured webhook URL, or None when alerts are off."""
    return settings.get(WEBHOOK_ENV) or None


def run_link(base_url: str, run_id: str) -> str:
    """Where the run is in the Dagster UI."""
    return f"{base_url.rstrip('/')}/runs/{run_id}"


def _mrkdwn(text: str, limit: int = _MAX_TEXT) -> str:
    """Escape Slack's control characters and keep within its size limit."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.4g}"


def _payload(headline: str, body: str, fields: dict[str, str], link: str) -> Payload:
    return {
        "text": f"{_mrkdwn(headline)}: {_mrkdwn(body)} ({link})",  # notifications, and non-Slack receivers
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": headline[:_MAX_HEADER]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(body)}},
            {
                "type": "section",
                "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{_mrkdwn(v, 1900)}"} for k, v in fields.items()],
            },
            {"type": "section", "text": {"type": "mrkdwn", "text": f"<{link}|Open the run in Dagster>"}},
        ],
    }


def check_alert(
    *,
    dataset: str,
    partition: str | None,
    check: str,
    severity: str,
    figure: float | None,
    threshold: float | None,
    message: str,
    run_id: str,
    base_url: str,
) -> Payload:
    """A failed check: dataset, partition, check, its figure against the threshold, a run link."""
    where = f"{dataset} [{partition}]" if partition else dataset
    return _payload(
        f"{severity} check {check} failed on {where}",
        message,
        {
            "Dataset": dataset,
            "Partition": partition or "(all)",
            "Check": f"{check} ({severity})",
            "Figure vs threshold": f"{_figure(figure)} vs {_figure(threshold)}",
        },
        run_link(base_url, run_id),
    )


def run_alert(
    *,
    job: str,
    run_id: str,
    base_url: str,
    error: str,
    dataset: str | None = None,
    partition: str | None = None,
) -> Payload:
    """A failed run: which job, dataset and partition, the first error line, a run link."""
    first_line = (error.strip().splitlines() or ["(no error message)"])[0]
    return _payload(
        f"Run failed: {job}" + (f" on {dataset} [{partition}]" if dataset and partition else ""),
        first_line,
        {"Job": job, "Dataset": dataset or "(n/a)", "Partition": partition or "(n/a)", "Run": run_id},
        run_link(base_url, run_id),
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
