"""Slack webhook payloads and delivery, against a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import json
import time

import pytest

from eagle_data.alerts import (
    WEBHOOK_ENV,
    AlertError,
    CheckFailure,
    check_alert,
    group_failures,
    post_alert,
    readable,
    run_alert,
    webhook_url,
)
from eagle_data.standins.webhook import Receiver

BASE = "http://dagster.local:3000/"
MESSAGE = "87.0% of rows have loss-mask sum 6 (limit 20%)"


def failure(
    shards: tuple[str, ...] = ("00003",), run_id: str = "abc-123", check: str = "empty_response"
) -> CheckFailure:
    return CheckFailure(
        run_id=run_id, dataset="b7_sharegpt", asset="b7_sharegpt_validated", check=check, severity="ERROR",
        shards=shards, message=MESSAGE, figure=0.87, threshold=0.2,
    )  # fmt: skip


def failed_check() -> dict:
    [alert] = group_failures([failure()])
    return check_alert(alert, BASE)


CHECK_PAGE = "http://dagster.local:3000/assets/b7_sharegpt_validated?view=checks&checkDetail=empty_response"


def test_check_alert_names_dataset_asset_shard_check_figures_and_links() -> None:
    payload = failed_check()
    text = json.dumps(payload, ensure_ascii=False)
    for needle in ("b7_sharegpt", "b7_sharegpt_validated", "00003", "empty_response", MESSAGE, "0.87 vs 0.2"):
        assert needle in text
    assert CHECK_PAGE in payload["text"] and "http://dagster.local:3000/runs/abc-123" in payload["text"]
    assert payload["blocks"][0] == {
        "type": "header",
        "text": {
            "type": "plain_text",
            "text": "ERROR check empty_response failed on b7_sharegpt (b7_sharegpt_validated) [00003]",
        },
    }
    assert payload["blocks"][-1]["text"]["text"] == (
        f"<{CHECK_PAGE}|Open the check> · <http://dagster.local:3000/runs/abc-123|Open the run>"
    )


def test_a_check_judging_no_single_figure_shows_none_in_its_alert() -> None:
    """Regression: a failed canary (its verdict is over several gates) posted "Figure vs threshold: n/a vs n/a"."""
    canary = CheckFailure(
        run_id="abc-123", dataset="b7_sharegpt", asset="b7_sharegpt_estimate", check="canary", severity="ERROR",
        shards=(), message="b7_sharegpt: canary failed on empty_response (16 prompts drawn across the dataset)",
    )  # fmt: skip
    [alert] = group_failures([canary])
    text = json.dumps(check_alert(alert, BASE))
    assert "n/a" not in text and "Figure vs threshold" not in text and "canary failed on empty_response" in text
    assert "0.87 vs 0.2" in json.dumps(failed_check())  # a gate's figure still shows


@pytest.mark.parametrize(
    "evaluations",
    [
        pytest.param([failure(("00001",)), failure(("00004",)), failure(("00002",))], id="one-evaluation-per-shard"),
        pytest.param([failure(("00001", "00002", "00004"))], id="one-evaluation-for-the-range"),
    ],
)
def test_one_alert_per_run_and_check_lists_every_failing_shard(evaluations: list[CheckFailure]) -> None:
    """ "Execute all" after one threshold change judged every shard: one message, not one per shard."""
    other_check = failure(("00001",), check="lost_text")
    other_run = failure(("00001",), run_id="def-456")
    alerts = group_failures([*evaluations, other_check, other_run])
    assert [(a.run_id, a.check) for a in alerts] == [
        ("abc-123", "empty_response"), ("abc-123", "lost_text"), ("def-456", "empty_response")
    ]  # fmt: skip
    assert alerts[0].shards == ["00001", "00002", "00004"]
    payload = check_alert(alerts[0], BASE)
    assert payload["blocks"][0]["text"]["text"].endswith("[00001, 00002, 00004]")
    assert {"type": "mrkdwn", "text": "*Failing shards*\n00001, 00002, 00004"} in payload["blocks"][2]["fields"]


def test_alerts_quote_errors_without_python_class_paths() -> None:
    assert readable("dagster._core.definitions.events.Failure: b7_sharegpt: no prompts\nTraceback") == (
        "b7_sharegpt: no prompts"
    )
    assert readable("eagle_data.sources.SourceError: b7_sharegpt: hub unreachable") == "b7_sharegpt: hub unreachable"
    assert readable("shard 00001: 87.0% of rows (limit 20%)") == "shard 00001: 87.0% of rows (limit 20%)"
    [alert] = group_failures([CheckFailure(**{**failure().__dict__, "message": "eagle_data.x.GateError: too short"})])
    assert "GateError" not in json.dumps(check_alert(alert, BASE))


def test_slack_control_characters_in_data_are_escaped() -> None:
    [alert] = group_failures(
        [CheckFailure(run_id="r", dataset="d", asset="d_validated", check="c", severity="ERROR", shards=(),
                      message="completion '<!channel> & <b>'")]
    )  # fmt: skip
    payload = check_alert(alert, BASE)
    body = payload["blocks"][1]["text"]["text"]
    assert body == "completion '&lt;!channel&gt; &amp; &lt;b&gt;'"
    assert "Figure vs threshold" not in json.dumps(payload)  # no figure: no "n/a vs n/a"


def test_run_alert_names_dataset_and_asset_and_keeps_the_first_error_line() -> None:
    payload = run_alert(
        job="__ASSET_JOB", run_id="r1", base_url=BASE,
        error="eagle_data.sources.SourceError: boom: shard 3\nTraceback...",
        dataset="b7_sharegpt", asset="b7_sharegpt_prompts", partition="00003",
    )  # fmt: skip
    assert payload["blocks"][0]["text"]["text"] == "Run failed: b7_sharegpt (b7_sharegpt_prompts) [00003]"
    assert payload["blocks"][1]["text"]["text"] == "boom: shard 3"
    assert "Traceback" not in json.dumps(payload) and "SourceError" not in json.dumps(payload)
    assert "http://dagster.local:3000/assets/b7_sharegpt_prompts" in payload["text"]


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
    with Receiver(delay=20.0) as receiver:
        start = time.monotonic()
        with pytest.raises(AlertError) as info:
            post_alert(failed_check(), receiver.url, timeout=0.3)
        assert time.monotonic() - start < 10  # the 0.3-s timeout, not the 20-s answer, with room for a loaded box
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
