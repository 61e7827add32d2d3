"""The breaker: each reply judged on arrival, a rolling window per dataset, a bad server stopped in one line
within a few hundred billed replies, healthy noise never stopped; billed rejects asked again only
`empty_retries` times."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from eagle_data.catalog import Breaker as BreakerSettings
from eagle_data.catalog import DatasetSpec
from eagle_data.engines import make_engine
from eagle_data.quality.reply import reply_verdict
from eagle_data.quality.summary import lower_bound
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.breaker import Breaker, BreakerTripped
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.types import Completion

DS = "b7_sharegpt"
SETTINGS = RunnerSettings(backoff_base_s=0.0, backoff_cap_s=0.0, progress_bar=False)
GOOD = [Completion(content=f"a reply of its own, number {i}", reasoning="because", completion_tokens=30)
        for i in range(2000)]  # fmt: skip
BAD = {
    "empty_completion": Completion(content="", completion_tokens=20),
    "lost_text": Completion(content="x", completion_tokens=20),  # the real server: 1 character for 20 tokens
    "short_loss": Completion(content="OK.", completion_tokens=3),
    "truncated": Completion(
        content=" ".join(f"word{i}" for i in range(30)), completion_tokens=100, finish_reason="length"
    ),
    "repeat": Completion(content="the same answer to every prompt", completion_tokens=30),
}


def _generate(server: FakeOpenAI, root: Path, shards: dict[str, pl.DataFrame], spec: DatasetSpec | None = None,
              lines: list[str] | None = None) -> dict:  # fmt: skip
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
    log = lines.append if lines is not None else (lambda _: None)
    return run_generation(engine, spec or spec_for_tests(), shards, ShardStore(str(root)), settings=SETTINGS, log=log)


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [(GOOD[0], "pass"), *((c, v if v != "repeat" else "pass") for v, c in BAD.items()),
     (Completion(content="", reasoning="cut while thinking " * 5, completion_tokens=64, finish_reason="length"),
      "truncated"),
     (Completion(content="", reasoning="thought, never answered", completion_tokens=5), "empty_completion"),
     (Completion(content="\u4e2d" * 10, completion_tokens=25), "pass")],  # 30 bytes: a CJK text is no lost text
)  # fmt: skip
def test_reply_verdicts_name_what_is_wrong_with_one_reply(reply: Completion, verdict: str) -> None:
    assert reply_verdict(reply, spec_for_tests().checks) == verdict


def test_the_wilson_bound_is_below_the_share_and_tightens_with_more_replies() -> None:
    assert lower_bound(0, 200, 0.9987) == 0.0
    assert lower_bound(2, 200, 0.9987) < 0.01 < lower_bound(200, 200, 0.9987)
    assert lower_bound(10, 100, 0.9987) < lower_bound(100, 1000, 0.9987) < 0.1


def _feed(breaker: Breaker, replies: Callable[[int], Completion], n: int, start: int = 0) -> int | None:
    """Judge n replies; the index at which the breaker tripped, or None."""
    for i in range(start, start + n):
        breaker.judge(f"p{i}", replies(i))
        if breaker.tripped:
            return i
    return None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_noise_just_under_every_gate_never_trips_over_10000_replies(seed: int) -> None:
    """0.8% empty, 0.8% lost text, 0.8% short (gates 1%), 4% one repeated completion (gate 5%), 4% cut
    (warning gate 5%): a plain window share would cross a gate in most runs; the bound never does."""
    rng, breaker = random.Random(seed), Breaker(spec_for_tests())
    noise = [("empty_completion", 0.008), ("lost_text", 0.008), ("short_loss", 0.008), ("repeat", 0.04),
             ("truncated", 0.04)]  # fmt: skip
    warnings: list[str] = []

    def reply(i: int) -> Completion:
        draw = rng.random()
        for verdict, p in noise:
            if draw < p:
                return BAD[verdict]
            draw -= p
        return GOOD[i % len(GOOD)]

    naive_over = 0
    for i in range(10_000):
        _, warning = breaker.judge(f"p{i}", reply(i))
        warnings += [warning] if warning else []
        if len(breaker.window) == 200 and breaker.verdicts["empty_completion"] > 2:
            naive_over += 1
        assert not breaker.tripped, breaker.tripped
    assert warnings == [] and naive_over > 0  # the plain share crossed 1% in some window; the breaker held


@pytest.mark.parametrize("verdict", ["empty_completion", "lost_text", "short_loss", "repeat"])
def test_a_server_turning_bad_after_hours_trips_the_rolling_window_in_one_line(verdict: str) -> None:
    spec = spec_for_tests()
    breaker = Breaker(spec)
    assert _feed(breaker, lambda i: GOOD[i % len(GOOD)], 10_000) is None
    tripped = _feed(breaker, lambda i: BAD[verdict], 300, start=10_000)
    assert tripped is not None and tripped - 10_000 < 30
    line = breaker.tripped
    assert "\n" not in line and line.startswith(f"{DS}: breaker: ") and "of the last 200 replies" in line
    assert f"p{tripped}, p{tripped - 1}, p{tripped - 2}" in line  # three example prompt ids
    assert f"[datasets.{DS}.breaker] enabled = false" in line


def test_truncation_is_announced_once_never_stopped_on() -> None:
    breaker = Breaker(spec_for_tests())
    warnings = [w for i in range(1000) if (w := breaker.judge(f"p{i}", BAD["truncated"])[1])]
    assert not breaker.tripped and len(warnings) == 1 and "raise generation.max_tokens" in warnings[0]
    assert breaker.pulse() == "window 200: 0.0% rejected, 100.0% truncated"


def test_the_breaker_can_be_turned_off_per_dataset() -> None:
    breaker = Breaker(spec_for_tests(breaker=BreakerSettings(enabled=False)))
    assert _feed(breaker, lambda i: BAD["empty_completion"], 1000) is None
    assert breaker.shares()["empty_completion"] == 1.0  # still measured for the pulse


@pytest.mark.parametrize("fault", ["p_empty", "p_lost_text"])
def test_a_range_whose_every_reply_lost_its_text_stops_within_250_billed_replies(
    server: FakeOpenAI, tmp_path: Path, fault: str
) -> None:
    server.faults = Faults(**{fault: 1.0})
    lines: list[str] = []
    with pytest.raises(BreakerTripped) as raised:
        _generate(server, tmp_path, prompt_shards(10, 100), lines=lines)
    billed = sum(server.answered.values())
    assert billed <= 250, billed
    message = str(raised.value)
    verdict = "empty_completion" if fault == "p_empty" else "lost_text"
    assert "\n" not in message and f"replies were {verdict}" in message
    assert any(line.startswith(f"{DS}: breaker:") and "stopped sending" in line for line in lines)


def test_a_server_turning_bad_after_1000_replies_is_stopped_and_the_good_rows_are_reused(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.faults = Faults(healthy_first=1000, p_empty=1.0)
    shards = prompt_shards(20, 100)
    with pytest.raises(BreakerTripped):
        _generate(server, tmp_path, shards)
    billed = sum(server.answered.values())
    assert 1000 < billed <= 1300, billed
    store = ShardStore(str(tmp_path))
    first = pl.concat([store.read_shard(DS, DS, p) for p in shards if store.shard_exists(DS, DS, p)])
    good = set(first.filter(pl.col("status") == "ok")["prompt_id"])
    assert len(good) >= 1000 - SETTINGS.initial_in_flight  # every good reply landed durable

    server.faults = Faults()  # healthy again: the re-run asks only for what is missing
    reports = _generate(server, tmp_path, shards)
    assert sum(r.figures.counts.reused for r in reports.values()) == len(good)
    assert all(server.answered[f"{p}#1"] == 1 for p in good)  # none of them paid for twice


def test_healthy_noise_end_to_end_is_asked_again_and_never_trips(server: FakeOpenAI, tmp_path: Path) -> None:
    server.faults = Faults(p_empty=0.008, seed=3)
    lines: list[str] = []
    reports = _generate(server, tmp_path, prompt_shards(4, 500), lines=lines)
    wasted = sum(r.figures.counts.wasted for r in reports.values())
    assert wasted == server.outcomes["empty"] > 0
    assert sum(r.figures.counts.ok for r in reports.values()) >= 2000 - wasted // 2  # a retry mostly rescued them
    assert any(f"wasted: {wasted} replies, $" in line for line in lines[-3:])
    assert any(" | window 200: " in line and "% rejected" in line for line in lines)


@pytest.mark.parametrize("retries", [0, 2])
def test_an_empty_reply_is_asked_again_at_most_empty_retries_times(
    server: FakeOpenAI, tmp_path: Path, retries: int
) -> None:
    server.faults = Faults(shape="null_content")
    spec = spec_for_tests(breaker=BreakerSettings(empty_retries=retries))
    with pytest.raises(Exception, match="every request failed"):
        _generate(server, tmp_path, prompt_shards(1, 5), spec)
    assert sorted(server.requests.values()) == [1 + retries] * 5  # counted per prompt at the server
    rows = ShardStore(str(tmp_path)).read_shard(DS, DS, "00000")
    assert rows["status"].to_list() == ["failed"] * 5 and rows["attempts"].to_list() == [1 + retries] * 5
