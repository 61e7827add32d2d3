"""Pure pieces of the runner: retry policy, AIMD limiter, turn walking, resume keys, progress, estimate."""

from __future__ import annotations

import asyncio
import io
import random
from collections import Counter
from dataclasses import fields

import polars as pl
import pytest

from eagle_data.retry_after import parse_retry_after
from eagle_data.runner.concurrency import AdaptiveLimiter
from eagle_data.runner.estimate import estimate_generation
from eagle_data.runner.progress import Counts, ProgressBar, Tally
from eagle_data.runner.resultlog import resume_key, reusable
from eagle_data.runner.retry import backoff_delay, retry_delay, should_retry
from eagle_data.runner.rows import plan_turns, to_frame
from eagle_data.runner.settings import RunnerSettings
from eagle_data.standins.openai_fake import spec_for_tests
from eagle_data.types import FatalError, RetryableError

S = RunnerSettings(max_attempts=3, max_throttle_waits=2, backoff_base_s=1.0, backoff_cap_s=8.0)


# ---- retry -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("attempt", "rand", "expected"), [(1, 0.0, 0.5), (1, 1.0, 1.0), (3, 0.0, 2.0), (10, 1.0, 8.0)])
def test_backoff_is_exponential_jittered_and_capped(attempt: int, rand: float, expected: float) -> None:
    assert backoff_delay(attempt, 1.0, 8.0, rand) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("3", 3.0),
        ("0.25", 0.25),
        ("-4", 0.0),
        ("99999", 99999.0),  # not capped here: the runner caps the wait and says so
        ("Thu, 01 Jan 1970 00:01:40 GMT", 40.0),
        ("soon", None),
        (None, None),
        ("", None),
    ],
)
def test_parse_retry_after_reads_seconds_and_http_dates(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now=60.0) == expected


def test_should_retry_fatal_never_retryable_within_max_attempts() -> None:
    err = RetryableError("boom", kind="http_500")
    assert should_retry(err, attempts=2, throttle_waits=0, settings=S)
    assert not should_retry(err, attempts=3, throttle_waits=0, settings=S)
    assert not should_retry(FatalError("bad", kind="http_400"), attempts=1, throttle_waits=0, settings=S)


def test_throttles_have_their_own_allowance() -> None:
    err = RetryableError("slow down", kind="http_429", throttle=True)
    assert should_retry(err, attempts=3, throttle_waits=2, settings=S)  # max_attempts spent, throttle not
    assert not should_retry(err, attempts=0, throttle_waits=3, settings=S)


def test_retry_delay_honours_a_longer_retry_after() -> None:
    rng = random.Random(0)
    assert retry_delay(RetryableError("x", retry_after=30.0), 1, S, rng) == 30.0
    assert 0.5 <= retry_delay(RetryableError("x", retry_after=0.1), 1, S, rng) <= 1.0


@pytest.mark.parametrize(
    "bad",
    [
        dict(min_in_flight=0),
        dict(initial_in_flight=5000),
        dict(max_attempts=0),
        dict(backoff_cap_s=0.1),
        dict(flush_every_s=0),
        dict(progress_every=0),
    ],
)
def test_settings_reject_inconsistent_values(bad: dict) -> None:
    with pytest.raises(ValueError, match="runner settings"):
        RunnerSettings(**bad)


# ---- AIMD limiter ------------------------------------------------------------------------------------
def test_limiter_slow_starts_then_cuts_once_per_epoch_and_pauses() -> None:
    now = [100.0]
    lim = AdaptiveLimiter(initial=10, minimum=2, maximum=100, clock=lambda: now[0])
    for _ in range(10):
        lim.on_success()
    assert lim.current == 20  # +1 per success: doubling per round trip
    epoch = lim.epoch
    lim.on_throttle(epoch, retry_after=5.0)
    lim.on_throttle(epoch, retry_after=None)  # same burst: no second cut
    assert (lim.current, lim.cuts, lim.paused_until) == (10, 1, 105.0)
    lim.on_success()
    assert lim.limit == pytest.approx(10.8)  # past the threshold: at least AI_STEP per round trip
    for _ in range(10):
        lim.on_throttle(lim.epoch, None)
    assert lim.current == 2  # never below the floor


def test_limiter_blocks_at_the_limit_and_hands_slots_over() -> None:
    async def scenario() -> list[str]:
        lim = AdaptiveLimiter(initial=2, minimum=1, maximum=4)
        order: list[str] = []
        await lim.acquire()
        await lim.acquire()
        waiter = asyncio.create_task(lim.acquire())
        await asyncio.sleep(0)
        order.append(f"blocked={not waiter.done()} in_flight={lim.in_flight}")
        lim.release()
        await waiter
        order.append(f"woken in_flight={lim.in_flight}")
        return order

    assert asyncio.run(scenario()) == ["blocked=True in_flight=2", "woken in_flight=2"]


# ---- turns -------------------------------------------------------------------------------------------
CONV = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "u2a"},
    {"role": "user", "content": "u2b"},
    {"role": "assistant", "content": "a2"},
    {"role": "user", "content": "u3"},
    {"role": "assistant", "content": "a3"},
]


def test_plan_turns_drops_old_replies_and_caps_turns() -> None:
    contents = [[m["content"] for m in seg] for seg in plan_turns(CONV, "all", 8)]
    assert contents == [["sys", "u1"], ["u2a", "u2b"], ["u3"]]
    assert [[m["content"] for m in seg] for seg in plan_turns(CONV, "all", 2)] == [
        ["sys", "u1"],
        ["u2a", "u2b"],
    ]
    assert [[m["content"] for m in seg] for seg in plan_turns(CONV, "first", 8)] == [["sys", "u1"]]
    assert plan_turns([{"role": "assistant", "content": "x"}], "all", 8) == []


# ---- resume keys -------------------------------------------------------------------------------------
def _row(pid: str, status: str, key, max_tokens: int, t: float) -> dict:
    return {
        "prompt_id": pid,
        "status": status,
        "config_hash": key.config_hash,
        "base_hash": key.base_hash,
        "max_tokens": max_tokens,
        "finished_at": t,
        "content": "a reply with text",  # an empty reply is never reusable (test_engine_replies)
    }


def test_resume_key_moves_with_the_config_but_base_ignores_max_tokens() -> None:
    spec = spec_for_tests()
    k1 = resume_key({"model": "m", "max_tokens": 4096}, spec)
    k2 = resume_key({"model": "m", "max_tokens": 8192}, spec)
    k3 = resume_key({"model": "m", "max_tokens": 4096, "provider": {"ignore": ["fireworks"]}}, spec)
    assert k1.config_hash != k2.config_hash and k1.base_hash == k2.base_hash and k2.max_tokens == 8192
    assert k3.base_hash != k1.base_hash
    assert (
        resume_key({"model": "m"}, spec_for_tests(max_turns=2)).config_hash
        != resume_key({"model": "m"}, spec).config_hash
    )


def test_reusable_keeps_ok_rows_under_a_raised_cap_and_drops_truncated_failed() -> None:
    spec = spec_for_tests()
    old, new = resume_key({"max_tokens": 40}, spec), resume_key({"max_tokens": 80}, spec)
    stored = to_frame(
        [
            _row("ok", "ok", old, 40, 1.0),
            _row("trunc", "truncated", old, 40, 1.0),
            _row("fail", "failed", old, 40, 1.0),
            _row("later", "failed", new, 80, 1.0),
            _row("later", "ok", new, 80, 2.0),
            _row("gone", "skipped_budget", new, 80, 1),
        ]
    )
    assert sorted(reusable(stored, new)["prompt_id"]) == ["later", "ok"]
    assert set(reusable(stored, new)["config_hash"]) == {new.config_hash}
    assert sorted(reusable(stored, old)["prompt_id"]) == ["ok", "trunc"]  # exact config: truncated is final
    lowered = resume_key({"max_tokens": 20}, spec)
    assert reusable(stored, lowered).is_empty()  # a lower cap could have cut any of them


# ---- progress ----------------------------------------------------------------------------------------
def test_progress_line_matches_the_format_users_read() -> None:
    t = Tally(total=3572, started=0.0, ended=2550 / 27.0, ok=2550, completion_tokens=448_800, cost_usd=1.0)
    assert t.line() == "2550/3572 (0 err, 2550 ok) 27.0 req/s avg_comp=176tok tot=0.4M ~$1.0 ETA=0.0h"
    figures = t.figures(in_flight_limit=64).to_metadata()
    assert figures["req_per_s"] == 27.0 and figures["in_flight_limit"] == 64 and figures["truncation_rate"] == 0.0


def test_shard_figures_add_every_count_and_keep_the_last_shards_pace() -> None:
    first = Tally(total=10, started=0, ended=1.0, ok=8, truncated=2, completion_tokens=100, errors=Counter(http_500=3))
    last = Tally(total=10, started=0.0, ended=2.0, ok=10, completion_tokens=300, errors=Counter(reset=1), wasted=2)
    both = (first.figures(8, {"config_hash": "a"}) + last.figures(16, {"config_hash": "b"})).to_metadata()
    assert both["errors_by_kind"] == {"http_500": 3, "reset": 1}
    assert both["total"] == both["done"] == 20 and both["wasted_replies"] == 2
    assert both["avg_comp"] == 20.0 and both["truncation_rate"] == 0.1  # recomputed from the summed counts
    assert both["in_flight_limit"] == 16 and both["elapsed_s"] == 2.0 and both["config_hash"] == "b"


def test_every_count_sums() -> None:
    """A count added to `Counts` adds up across shards without being named anywhere else."""
    one = Counts(**{f.name: Counter(kind=1) if f.name == "errors" else 1 for f in fields(Counts)})
    two = one + one
    assert all(getattr(two, f.name) == (Counter(kind=2) if f.name == "errors" else 2) for f in fields(Counts))


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_tty_only() -> None:
    tty, pipe = _Tty(), io.StringIO()
    t = Tally(total=10, ok=5)
    ProgressBar(True, tty).update(t, 32, force=True)
    ProgressBar(True, pipe).update(t, 32, force=True)
    assert tty.getvalue().startswith("\r[" + "#" * 15 + "." * 15 + "] 5/10") and "inflight<=32" in tty.getvalue()
    assert pipe.getvalue() == ""


# ---- estimate ----------------------------------------------------------------------------------------
def test_estimate_counts_prompt_tokens_per_turn_and_projects_cost() -> None:
    spec = spec_for_tests(max_turns=8, token_budget=1000, cost_budget_usd=1.0)
    prompts = pl.DataFrame({"messages": [CONV[1:3] + CONV[6:8]]})  # two turns: "u1", then "u3"
    sample = pl.DataFrame(
        {
            "status": ["ok", "failed"],
            "completion_tokens": [100, 0],
            "messages": [[{"role": "user"}, {"role": "assistant"}], [{"role": "user"}]],
        }
    )
    est = estimate_generation([prompts], spec, lambda texts: [len(t) for t in texts], sample, 1e-3, 2e-3)
    # turn 1: "u1" (2) + 4 framing = 6; turn 2: 6 + "u3" (2) + 4 + one earlier reply (100 + 4) = 116
    assert (est.turns, est.prompt_tokens, est.completion_tokens) == (2, 122, 200)
    assert est.usd == pytest.approx(122e-3 + 200 * 2e-3)
    assert "32% of the token budget" in est.line() and est.figures()["est_tokens"] == 322
