"""Slack webhook payloads and delivery, against a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import json
import time

import pytest

from eagle_data.alerts import WEBHOOK_ENV, AlertError, check_alert, post_alert, run_alert, webhook_url
from eagle_data_tests.fixtures_quality import Receiver

BASE = "http://dagster.local:3000/"
MESSAGE = "87.0% of rows have loss-mask sum 6 (limit 20%)"


def failed_check() -> dict:
    return check_alert(
        dataset="b7_sharegpt",
        partition="00003",
        check="empty_response",
        severity="ERROR",
        figure=0.87,
        threshold=0.2,
        message=MESSAGE,
        run_id="abc-123",
        base_url=BASE,
    )


def test_check_alert_names_dataset_partition_check_figures_and_run_link() -> None:
    payload = failed_check()
    text = json.dumps(payload, ensure_ascii=False)
    for needle in ("b7_sharegpt", "00003", "empty_response", MESSAGE, "0.87 vs 0.2"):
        assert needle in text
    assert "http://dagster.local:3000/runs/abc-123" in payload["text"]
    assert payload["blocks"][0] == {
        "type": "header",
        "text": {"type": "plain_text", "text": "ERROR check empty_response failed on b7_sharegpt [00003]"},
    }
    assert payload["blocks"][-1]["text"]["text"] == "<http://dagster.local:3000/runs/abc-123|Open the run in Dagster>"


def test_slack_control_characters_in_data_are_escaped() -> None:
    payload = check_alert(
        dataset="d", partition=None, check="c", severity="ERROR", figure=None, threshold=None,
        message="completion '<!channel> & <b>'", run_id="r", base_url=BASE,
    )  # fmt: skip
    body = payload["blocks"][1]["text"]["text"]
    assert body == "completion '&lt;!channel&gt; &amp; &lt;b&gt;'"
    assert "n/a vs n/a" in json.dumps(payload)


def test_run_alert_keeps_the_first_error_line() -> None:
    payload = run_alert(
        job="b7_sharegpt_job", run_id="r1", base_url=BASE, error="boom: shard 3\nTraceback...",
        dataset="b7_sharegpt", partition="00003",
    )  # fmt: skip
    assert payload["blocks"][0]["text"]["text"] == "Run failed: b7_sharegpt_job on b7_sharegpt [00003]"
    assert payload["blocks"][1]["text"]["text"] == "boom: shard 3"
    assert "Traceback" not in json.dumps(payload)


def test_post_alert_delivers_the_json_body() -> None:
    payload = failed_check()
    with Receiver() as receiver:
        assert post_alert(payload, receiver.url, timeout=5) == 200
    assert receiver.bodies == [payload]
    assert receiver.headers[0]["Content-Type"] == "application/json"


def test_a_refusing_webhook_raises_without_the_url() -> None:
    with Receiver(status=403) as receiver, pytest.raises(AlertError) as info:
        post_alert(failed_check(), receiver.url, timeout=5)
    assert "HTTP 403" in str(info.value) and "s3cr3t" not in str(info.value) and "127.0.0.1" not in str(info.value)


def test_a_slow_webhook_times_out_without_the_url() -> None:
    with Receiver(delay=2.0) as receiver:
        start = time.monotonic()
        with pytest.raises(AlertError) as info:
            post_alert(failed_check(), receiver.url, timeout=0.3)
        assert time.monotonic() - start < 1.5
    assert "s3cr3t" not in str(info.value)


def test_an_unreachable_or_malformed_webhook_raises_without_the_url() -> None:
    with Receiver() as receiver:
        closed = receiver.url
    with pytest.raises(AlertError, match="unreachable") as info:
        post_alert(failed_check(), closed, timeout=2)
    assert "s3cr3t" not in str(info.value)
    with pytest.raises(AlertError, match="malformed") as info:
        post_alert(failed_check(), "hooks.slack.com/services/s3cr3t", timeout=2)
    assert "s3cr3t" not in str(info.value)


def test_webhook_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WEBHOOK_ENV, " https://hooks.example/x ")
    assert webhook_url() == "https://hooks.example/x"
    monkeypatch.setenv(WEBHOOK_ENV, "")
    assert webhook_url() is None
