"""Token and USD budgets: stop sending at the budget, let in-flight land, mark the rest skipped_budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.storage import ShardStore
from eagle_data_tests.servers.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests

DS = "b7_sharegpt"
IN_FLIGHT = 64
REPLY = 100  # completion tokens per reply; prompts are ~6 tokens


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    srv = FakeOpenAI(Faults(latency_s=0.01, latency_jitter_s=0.02, reply_tokens=(REPLY, REPLY)))
    srv.start()
    yield srv
    srv.stop()


def _run(server: FakeOpenAI, root: Path, shards: dict[str, pl.DataFrame], lines: list[str], **budget: float) -> dict:
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m")
    settings = RunnerSettings(max_in_flight=IN_FLIGHT, initial_in_flight=IN_FLIGHT, progress_bar=False)
    return run_generation(engine, spec_for_tests(**budget), shards, ShardStore(str(root)), settings=settings,
                          log=lines.append)  # fmt: skip


def _frame(root: Path, shards: dict[str, pl.DataFrame]) -> pl.DataFrame:
    return pl.concat([ShardStore(str(root)).read_shard(DS, DS, p) for p in shards])


def test_token_budget_stops_within_one_in_flight_window(server: FakeOpenAI, tmp_path: Path) -> None:
    shards = prompt_shards(4, 250)
    lines: list[str] = []
    _run(server, tmp_path, shards, lines, token_budget=50_000)
    out = _frame(tmp_path, shards)
    answered = out.filter(pl.col("status") == "ok")
    used = int(answered["prompt_tokens"].sum() + answered["completion_tokens"].sum())
    per_request = int((answered["prompt_tokens"] + answered["completion_tokens"]).max())
    assert 50_000 <= used <= 50_000 + IN_FLIGHT * per_request
    assert out.height == 1000 and set(out["status"]) == {"ok", "skipped_budget"}
    assert sum(server.answered.values()) == answered.height  # nothing sent beyond what landed
    assert any("token budget reached" in line and "skipped_budget" in line for line in lines)

    lines.clear()
    reports = _run(server, tmp_path, shards, lines, token_budget=200_000)  # raise it: the rest follows
    assert set(_frame(tmp_path, shards)["status"]) == {"ok"}
    assert sum(r.figures["reused"] for r in reports.values()) == answered.height


def test_cost_budget_counts_what_other_partitions_already_spent(server: FakeOpenAI, tmp_path: Path) -> None:
    lines: list[str] = []
    first = prompt_shards(1, 100)
    _run(server, tmp_path, first, lines)
    spent = float(_frame(tmp_path, first)["cost_usd"].sum())  # ~ 100 * 106 tokens * 1e-6 $/token
    second = {"00001": prompt_shards(2, 300)["00001"]}
    figures = _run(server, tmp_path, second, lines, cost_budget_usd=spent * 2)["00001"].figures
    assert 100 <= figures["ok"] <= 100 + IN_FLIGHT and figures["skipped_budget"] == 300 - figures["ok"]
    assert figures["budget_stop"].startswith(f"{DS}: cost budget reached")


def test_budget_stop_lets_conversations_under_way_finish_so_no_paid_reply_is_lost(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    shards = prompt_shards(1, 300, turns=3)
    _run(server, tmp_path, shards, [], token_budget=60_000)
    out = _frame(tmp_path, shards)
    replies = out["messages"].list.eval(pl.element().struct.field("role") == "assistant").list.sum()
    assert set(out["status"]) == {"ok", "skipped_budget"}
    assert set(replies.filter(out["status"] == "ok")) == {3}  # every started conversation finished
    assert set(out.filter(pl.col("status") == "skipped_budget")["completion_tokens"]) == {0}  # nothing paid, lost
    assert sum(server.answered.values()) == 3 * out.filter(pl.col("status") == "ok").height
