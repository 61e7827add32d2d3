"""Token and USD budgets: in-flight requests count at their worst case, so sending stops before the budget
would be crossed; in-flight requests land, the rest are marked skipped_budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from eagle_data.catalog import Breaker
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.budget import Budget
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.types import Completion

DS = "b7_sharegpt"
IN_FLIGHT = 64
REPLY = 100  # completion tokens per reply; prompts are ~6 tokens
NO_BREAKER = Breaker(enabled=False)  # every reply is the same text: a repeat the breaker would stop


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    srv = FakeOpenAI(Faults(latency_s=0.01, latency_jitter_s=0.02, reply_tokens=(REPLY, REPLY)))
    srv.start()
    yield srv
    srv.stop()


def _run(
    server: FakeOpenAI, root: Path, shards: dict[str, pl.DataFrame], lines: list[str], max_tokens: int = 0,
    **budget: float,
) -> dict:  # fmt: skip
    extra = {"max_tokens": max_tokens} if max_tokens else {}
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", **extra)
    settings = RunnerSettings(max_in_flight=IN_FLIGHT, initial_in_flight=IN_FLIGHT, progress_bar=False)
    return run_generation(engine, spec_for_tests(breaker=NO_BREAKER, **budget), shards, ShardStore(str(root)),
                          settings=settings, log=lines.append)  # fmt: skip


def _frame(root: Path, shards: dict[str, pl.DataFrame]) -> pl.DataFrame:
    return pl.concat([ShardStore(str(root)).read_shard(DS, DS, p) for p in shards])


def test_token_budget_stops_within_one_in_flight_window(server: FakeOpenAI, tmp_path: Path) -> None:
    shards = prompt_shards(4, 250)
    lines: list[str] = []
    _run(server, tmp_path, shards, lines, token_budget=50_000)
    out = _frame(tmp_path, shards)
    answered = out.filter(pl.col("status") == "ok")
    used = int(answered["prompt_tokens"].sum() + answered["completion_tokens"].sum())
    worst = 4096 + 64  # max_tokens and the prompt's bytes: what a request may take at most
    assert 50_000 - worst <= used <= 50_000  # never crossed
    assert out.height == 1000 and set(out["status"]) == {"ok", "skipped_budget"}
    assert sum(server.answered.values()) == answered.height  # nothing sent beyond what landed
    assert any("token budget reached" in line and "skipped_budget" in line for line in lines)

    lines.clear()
    reports = _run(server, tmp_path, shards, lines, token_budget=200_000)  # raise it: the rest follows
    assert set(_frame(tmp_path, shards)["status"]) == {"ok"}
    assert sum(r.figures.counts.reused for r in reports.values()) == answered.height


def test_cost_budget_counts_what_other_partitions_already_spent(server: FakeOpenAI, tmp_path: Path) -> None:
    lines: list[str] = []
    first = prompt_shards(1, 100)
    _run(server, tmp_path, first, lines)
    spent = float(_frame(tmp_path, first)["cost_usd"].sum())  # ~ 100 * 106 tokens * 1e-6 $/token
    second = {"00001": prompt_shards(2, 300)["00001"]}
    figures = _run(server, tmp_path, second, lines, cost_budget_usd=spent * 2)["00001"].figures.to_metadata()
    # It stops once one more worst case (4,096 tokens at the learned price bound: ~47 replies) would not fit.
    assert 100 - 50 <= figures["ok"] <= 100 and figures["skipped_budget"] == 300 - figures["ok"]
    assert figures["budget_stop"].startswith(f"{DS}: cost budget reached")


def test_every_turn_of_a_conversation_is_held_so_a_budget_is_never_crossed_and_no_paid_turn_is_lost(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    """#34.2: only a conversation's first turn was held, so at the stop the later turns of every conversation
    under way crossed the budget (4 turns: 214,529 tokens against 150,000)."""
    shards, budget = prompt_shards(1, 300, turns=4), 40_000  # ~160,000 tokens' worth of turns
    _run(server, tmp_path, shards, [], max_tokens=REPLY, token_budget=budget)
    used = round(server.billed_usd / Faults().cost_per_token)  # every billed token, counted at the server
    assert 0.9 * budget <= used <= budget, used
    out = _frame(tmp_path, shards)
    assert set(out["status"]) == {"ok", "skipped_budget"}

    _run(server, tmp_path, shards, [], max_tokens=REPLY)  # no budget: the rest follows, paid turns replayed
    assert set(_frame(tmp_path, shards)["status"]) == {"ok"}
    assert len(server.answered) == 300 * 4 and max(server.answered.values()) == 1


def test_a_cost_budget_at_2000_in_flight_is_overshot_by_at_most_2_percent(tmp_path: Path) -> None:
    """#20.7: a $3 budget stopped at $6.28 when requests in flight were not counted. Prices are learned
    from the replies' reported cost; the spend is counted at the server."""
    server = FakeOpenAI(Faults(latency_s=0.2, latency_jitter_s=0.1, reply_tokens=(20, 60), cost_per_token=1e-4))
    server.start()
    try:
        shards, budget = prompt_shards(2, 2000), 15.0  # about 3,000 replies' worth
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
        settings = RunnerSettings(max_in_flight=2000, initial_in_flight=2000, progress_bar=False)
        run_generation(engine, spec_for_tests(cost_budget_usd=budget, breaker=Breaker(enabled=False)), shards,
                       ShardStore(str(tmp_path)), settings=settings, log=lambda _: None)  # fmt: skip
        assert 0.9 * budget <= server.billed_usd <= 1.02 * budget, server.billed_usd
        assert max(server.stats()["outcomes"].values()) < 4000  # it stopped before the prompts ran out
    finally:
        server.stop()


def test_in_flight_worst_cases_are_priced_by_bounds_the_replies_give() -> None:
    budget = Budget(DS, 0, 1.0)
    assert budget.worst(10, 100) == (110, None) and budget.fits(110, None)
    budget.hold(110, None)
    assert not budget.fits(110, None)  # price unknown: one request at a time until one lands
    budget.release(110, None)
    budget.learn(Completion("x", prompt_tokens=10, completion_tokens=100, cost_usd=10 * 1e-5 + 100 * 2e-5))
    budget.learn(Completion("x", prompt_tokens=1000, completion_tokens=10, cost_usd=1000 * 1e-5 + 10 * 2e-5))
    _, usd = budget.worst(50, 4000)
    assert usd is not None and 50 * 1e-5 + 4000 * 2e-5 <= usd <= 1.1 * (50 * 1e-5 + 4000 * 2e-5)
    unpriced = Budget(DS, 0, 1.0)  # an engine that reports no cost (local, SGLang)
    unpriced.learn(Completion("x", prompt_tokens=5, completion_tokens=5))
    assert unpriced.worst(10, 100) == (110, 0.0)
