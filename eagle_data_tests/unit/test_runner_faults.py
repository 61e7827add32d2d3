"""The runner against a misbehaving server: rate-limit bursts, 5xx, resets, errors inside 200 bodies."""

from __future__ import annotations

import io
import re
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from eagle_data.catalog import Breaker
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.progress import ProgressBar, Tally
from eagle_data.runner.run import NothingAnswered
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.standins.reply_shapes import fake_reply
from eagle_data.storage import ShardStore
from eagle_data.types import AbortError

# The acceptance at full scale: a 429 burst over the first 2,000 requests, a client allowed 2,000
# in flight, 10% random 5xx and resets; the server takes at most 48 at once during the burst.
BURST = Faults(latency_s=0.02, latency_jitter_s=0.02, rate_limit_first=2000, rate_limit_cap=48, retry_after="0.5")
PROGRESS_RE = (
    r"b7_sharegpt: \d+/\d+ \(\d+ err, \d+ ok\) [\d.]+ req/s avg_comp=\d+tok tot=[\d.]+M ~\$[\d.]+ ETA=[\d.]+h"
    r"( \| window \d+: [\d.]+% rejected, [\d.]+% truncated)?"  # the breaker's pulse
)
FAST_RETRY = {"backoff_base_s": 0.01, "backoff_cap_s": 0.1, "progress_bar": False}


def _run(server: FakeOpenAI, root: Path, shards: dict[str, pl.DataFrame], settings: RunnerSettings,
         lines: list[str] | None = None, **spec: object) -> dict:  # fmt: skip
    # A generous timeout: these runs test bursts, 5xx and resets, not timeouts, and a busy CI machine (2 cores,
    # tests in parallel) can hold 2,000 in-flight replies past a tight one, which is then retried and paid twice.
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=30.0)
    log = lines.append if lines is not None else (lambda _: None)
    return run_generation(engine, spec_for_tests(**spec), shards, ShardStore(str(root)), settings=settings, log=log)


def test_burst_plus_5xx_and_resets_every_prompt_ends_ok_nothing_lost_or_duplicated(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.faults = Faults(**{**BURST.__dict__, "p_5xx": 0.05, "p_reset": 0.05, "p_error_body": 0.01,
                              "p_finish_error": 0.01})  # fmt: skip
    shards = prompt_shards(3, 2000)
    lines: list[str] = []
    # 12% of attempts fail here: at the default 6 attempts, 6,000 prompts lose one with odds 6,000 x 0.12^6 = 1.8%
    # a run (more where a loaded machine adds timeouts); at 10, 6,000 x 0.12^10 = 4e-6. This test is about
    # bursts and resets being ridden out; the next test spends the attempt budget.
    settings = RunnerSettings(max_in_flight=2000, max_attempts=10, **FAST_RETRY)
    reports = _run(server, tmp_path, shards, settings, lines)

    store = ShardStore(str(tmp_path))
    out = pl.concat([store.read_shard("b7_sharegpt", "b7_sharegpt", p) for p in shards])
    assert out.height == 6000 and out["prompt_id"].n_unique() == 6000  # 0 lost, 0 duplicated rows
    assert set(out["prompt_id"]) == {pid for f in shards.values() for pid in f["prompt_id"]}
    failed = out.filter(pl.col("status") != "ok")
    assert failed.height == 0, failed.select("prompt_id", "status", "error").head(5).to_dicts()
    assert max(server.answered.values()) == 1  # no prompt was answered (paid for) twice
    errors = sum((r.figures.counts.errors for r in reports.values()), Counter())
    assert {"http_429", "reset", "body_error", "finish_error"} <= set(errors) and any(
        k.startswith("http_5") for k in errors
    )
    assert errors["reset"] == server.outcomes["reset"] and errors["http_429"] == server.outcomes["429"]
    # How few of the requests the ramp lets the burst reject depends on the machine's speed: that share is a
    # figure of benchmarks/bench_ratelimit.py, not an assertion here.
    assert any("first http_429 error" in line for line in lines)


def test_a_step_whose_every_request_failed_fails_in_one_line_and_the_next_run_retries_them(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    """#20.4: a server failing every request gave "0 ok, 10 failed" and a green step."""
    shards = prompt_shards(1, 30)
    server.faults = Faults(force_status=500)
    one_line = r"^b7_sharegpt: every request failed, no usable reply \(30 prompts failed; http_500 x60\); [^\n]*$"
    with pytest.raises(NothingAnswered, match=one_line):
        _run(server, tmp_path, shards, RunnerSettings(max_attempts=2, **FAST_RETRY))
    failed = ShardStore(str(tmp_path)).read_shard("b7_sharegpt", "b7_sharegpt", "00000")
    assert (
        failed.height == 30
        and set(failed["error"]) == {"http_500: HTTP 500: forced 500"}
        and set(failed["attempts"]) == {2}
    )
    server.faults = Faults()
    second = _run(server, tmp_path, shards, RunnerSettings(**FAST_RETRY))["00000"].figures.to_metadata()
    assert (second["ok"], second["reused"], second["requests"]) == (30, 0, 30)


@pytest.mark.parametrize(("status", "kind"), [(401, "http_401"), (403, "http_403"), (404, "http_404")])
def test_a_fatal_answer_stops_sending_keeps_what_landed_and_fails_the_call_with_the_servers_line(
    server: FakeOpenAI, tmp_path: Path, status: int, kind: str
) -> None:
    server.faults = Faults(force_status=status)
    lines: list[str] = []
    with pytest.raises(AbortError, match=f"^b7_sharegpt: {kind}: HTTP {status}: forced {status}$") as err:
        _run(server, tmp_path, prompt_shards(2, 500), RunnerSettings(**FAST_RETRY), lines)
    assert err.value.kind == kind  # the call's error keeps the answer's class and label (it was a bare FatalError)
    assert server.received <= RunnerSettings().initial_in_flight
    assert any(kind in line and "stopped sending" in line for line in lines)
    store = ShardStore(str(tmp_path))
    rows = pl.concat([store.read_shard("b7_sharegpt", "b7_sharegpt", p) for p in ("00000", "00001")])
    assert rows.height == 1000 and set(rows["status"]) == {"failed"}  # recorded, and re-requested next run


def test_multi_turn_rows_hold_the_regenerated_conversation_and_progress_is_logged(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.faults = Faults(reply_tokens=(5, 5))
    lines: list[str] = []
    settings = RunnerSettings(progress_every=10, **FAST_RETRY)
    # 60 5-token replies: short, which the breaker would stop
    _run(server, tmp_path, prompt_shards(1, 20, turns=3), settings, lines, breaker=Breaker(enabled=False))
    row = ShardStore(str(tmp_path)).read_shard("b7_sharegpt", "b7_sharegpt", "00000").row(0, named=True)
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * 3
    replies = [fake_reply(f"{row['prompt_id']}#{turn}", 5) for turn in (1, 2, 3)]
    assert [m["content"] for m in row["messages"][1::2]] == replies  # old replies replaced
    assert row["messages"][5]["reasoning"] == f"think {row['prompt_id']}#3" == row["reasoning"]
    assert (row["completion_tokens"], row["reasoning_tokens"], row["attempts"]) == (15, 6, 3)
    assert row["provider"] == "FakeProvider" and row["cost_usd"] > 0 and row["status"] == "ok"
    progress = [line for line in lines if re.fullmatch(PROGRESS_RE, line)]
    assert [p.split()[1] for p in progress[:2]] == ["10/20", "20/20"]


def test_a_server_that_never_answers_gets_a_heartbeat_with_the_oldest_requests_age(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.faults = Faults(p_hang=1.0)  # accepts every request and never answers
    lines: list[str] = []
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=2.5)
    settings = RunnerSettings(max_attempts=1, heartbeat_every_s=0.5, **FAST_RETRY)
    with pytest.raises(NothingAnswered):
        run_generation(engine, spec_for_tests(), prompt_shards(1, 2), ShardStore(str(tmp_path)), settings=settings,
                       log=lines.append)  # fmt: skip
    beats = [line for line in lines if "heartbeat" in line]
    assert re.fullmatch(r"b7_sharegpt: heartbeat: 2 in flight, oldest \d+ s, 0/2 done, 0 errors so far", beats[0])
    ages = [int(m.group(1)) for line in beats if (m := re.search(r"oldest (\d+) s", line))]
    assert len(beats) >= 2 and max(ages) >= 2 and ages == sorted(ages)  # the age grows while nothing lands


def test_the_progress_bar_shows_what_is_in_flight() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    ProgressBar(True, stream).update(Tally(total=10), 32, "3 in flight, oldest 41 s", force=True)
    assert "inflight<=32 3 in flight, oldest 41 s" in stream.getvalue()


def test_a_long_retry_after_is_announced_and_waited_for_at_most_max_retry_wait_s(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    """#20.8: `Retry-After: 3600` gave minutes of silence; the wait is said, capped, then retried."""
    server.faults = Faults(rate_limit_first=3, retry_after="3600")
    lines: list[str] = []
    started = time.monotonic()
    _run(server, tmp_path, prompt_shards(1, 3), RunnerSettings(max_retry_wait_s=0.3, **FAST_RETRY), lines)
    assert time.monotonic() - started < 60  # capped at 0.3 s a wait, not the hour asked for
    said = [line for line in lines if "provider asked to wait" in line]
    assert len(said) == 1  # once per heartbeat interval, not once per request
    assert re.fullmatch(
        r"b7_sharegpt: provider asked to wait \d+ s \(Retry-After\); waiting 0.3 s, then retrying; "
        r"set max_retry_wait_s to wait less, or max_throttle_waits=0 to fail these prompts instead",
        said[0],
    )
    assert set(ShardStore(str(tmp_path)).read_shard("b7_sharegpt", "b7_sharegpt", "00000")["status"]) == {"ok"}
