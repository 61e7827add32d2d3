"""Exact resume: SIGKILL mid-run, re-run; raising max_tokens re-generates only the truncated rows."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.resultlog import ResultLog
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore

DS = "b7_sharegpt"
KILL_SHARDS, KILL_PER_SHARD = 3, 400
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    srv = FakeOpenAI(Faults(latency_s=0.05, latency_sigma=0.5))
    srv.start()
    yield srv
    srv.stop()


def generate(
    url: str, root: str, max_tokens: int = 4096, shards: dict[str, pl.DataFrame] | None = None, **settings: Any
) -> dict:
    """One run against the fake at `url` (also the child process's entry point)."""
    engine = make_engine("openai", base_url=url, model="m", max_tokens=max_tokens)
    shards = shards if shards is not None else prompt_shards(KILL_SHARDS, KILL_PER_SHARD, turns=2)
    chosen = RunnerSettings(**{"max_in_flight": 200, "initial_in_flight": 200, "flush_every_s": 0.2,
                               "progress_bar": False, **settings})  # fmt: skip
    return run_generation(engine, spec_for_tests(), shards, ShardStore(root), settings=chosen, log=lambda _: None)


def durable_turns(store: ShardStore) -> set[str]:
    """Turns on disk, keyed as the fake server counts requests (`{prompt_id}#{user turns sent}`): every
    reply of a finished shard's rows, and every turn record of the durable turn logs."""
    turns = set()
    for key in (k for k in store.list(f"{DS}/{DS}") if k.endswith(".parquet")):
        for pid, messages in store.read_frame(key).select("prompt_id", "messages").iter_rows():
            replies = sum(m["role"] == "assistant" for m in messages)
            turns.update(f"{pid}#{n}" for n in range(1, replies + 1))
    for partition in (f"{s:05d}" for s in range(KILL_SHARDS)):
        turns.update(f"{t['prompt_id']}#{t['turn'] + 1}" for t in ResultLog(store, DS, partition).load_turns())
    return turns


def test_sigkill_mid_run_then_rerun_matches_an_uninterrupted_run_and_resends_nothing_durable(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{server.port}/v1"
    root = str(tmp_path / "killed")
    code = f"from eagle_data_tests.unit.test_runner_resume import generate; generate({url!r}, {root!r})"
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    store = ShardStore(root)
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:  # kill mid-shard, once parts are on disk
        if sum(server.answered.values()) >= 1200 and store.list(f"{DS}/{DS}/_log"):
            break
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    before = durable_turns(store)
    total = KILL_SHARDS * KILL_PER_SHARD
    assert 0 < len(before) < 2 * total, "the kill must land mid-run"

    generate(url, root)

    rerun = pl.concat([store.read_shard(DS, DS, f"{s:05d}") for s in range(KILL_SHARDS)])
    clean_root = str(tmp_path / "clean")
    generate(url, clean_root)
    clean = pl.concat([ShardStore(clean_root).read_shard(DS, DS, f"{s:05d}") for s in range(KILL_SHARDS)])
    assert rerun.height == total and set(rerun["prompt_id"]) == set(clean["prompt_id"])
    cols = ["prompt_id", "status", "content", "messages"]
    assert rerun.select(cols).sort("prompt_id").equals(clean.select(cols).sort("prompt_id"))
    # the server counts per prompt and turn; the clean run added exactly one request per turn
    twice = [k for k in before if server.requests[k] != 2]
    assert not twice, f"{len(twice)} turns durable before the kill were sent again: {twice[:3]}"
    assert not store.list(f"{DS}/{DS}/_log"), "finished shards supersede their checkpoint parts"


def test_sigkill_at_random_points_under_load_repays_at_most_one_second_of_answers(tmp_path: Path) -> None:
    """Three SIGKILLs at random moments 1-2.5 s into a run with the default flush interval; then a run to
    the end. Every answer the server gave twice was paid twice: at most one second's worth per kill."""
    server = FakeOpenAI(Faults(latency_s=0.1))  # 50 in flight: at most 500 answers/s, so every kill is mid-run
    url, root = server.start(), str(tmp_path / "killed")
    shards, per_shard = 4, 600
    flush = RunnerSettings().flush_every_s
    code = (f"from eagle_data_tests.unit.test_runner_resume import generate; from eagle_data.standins.openai_fake "
            f"import prompt_shards; generate({url!r}, {root!r}, shards=prompt_shards({shards}, {per_shard}, turns=2), "
            f"flush_every_s={flush}, max_in_flight=50, initial_in_flight=50)")  # fmt: skip
    rng, allowance = random.Random(), 0.0
    try:
        for _ in range(3):
            before = sum(server.answered.values())
            child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
            while sum(server.answered.values()) == before and child.poll() is None:  # answers are landing
                time.sleep(0.005)
            first = time.monotonic()
            time.sleep(rng.uniform(1.0, 2.5))
            os.kill(child.pid, signal.SIGKILL)
            rate = (sum(server.answered.values()) - before) / (time.monotonic() - first)
            child.wait()
            allowance += rate * 1.0  # one second of answers at the rate the run was going
        generate(url, root, shards=prompt_shards(shards, per_shard, turns=2))
    finally:
        server.stop()

    store = ShardStore(root)
    out = pl.concat([store.read_shard(DS, DS, f"{s:05d}") for s in range(shards)])
    assert out.height == shards * per_shard and set(out["status"]) == {"ok"}  # none lost
    assert set(out["messages"].list.len()) == {4}
    assert len(server.answered) == shards * per_shard * 2
    repaid = sum(n - 1 for n in server.answered.values())
    print(f"repaid {repaid} answers after 3 kills; one second each allows {allowance:.0f}")
    assert repaid <= allowance, f"{repaid} answers paid twice, more than 1 s worth ({allowance:.0f}) over 3 kills"


def test_a_failed_second_turn_is_retried_without_paying_for_the_first_again(server: FakeOpenAI, tmp_path: Path) -> None:
    url, root = f"http://127.0.0.1:{server.port}/v1", str(tmp_path)
    shards = prompt_shards(1, 20, turns=2)
    server.faults = Faults(fail_turn=2)
    first = generate(url, root, shards=shards, max_attempts=1)["00000"].figures.to_metadata()
    assert first["failed"] == 20 and set(server.requests.values()) == {1}

    server.faults = Faults()
    again = generate(url, root, shards=shards)["00000"].figures.to_metadata()

    assert again["ok"] == 20
    assert all(server.requests[f"s0-p{i}#1"] == 1 for i in range(20)), "turn 1 was paid for again"
    assert all(server.requests[f"s0-p{i}#2"] == 2 for i in range(20))
    out = ShardStore(root).read_shard(DS, DS, "00000")
    clean_root = str(tmp_path / "clean")
    generate(url, clean_root, shards=shards)
    clean = ShardStore(clean_root).read_shard(DS, DS, "00000")
    cols = ["prompt_id", "status", "content", "messages", "completion_tokens"]
    assert out.select(cols).equals(clean.select(cols))
    assert not ShardStore(root).list(f"{DS}/{DS}/_log"), "the carried turns are dropped once their rows finish"


def test_raising_max_tokens_regenerates_only_truncated_rows(server: FakeOpenAI, tmp_path: Path) -> None:
    url, root = f"http://127.0.0.1:{server.port}/v1", str(tmp_path)
    server.faults = Faults(reply_tokens=(20, 60))  # a prompt's natural reply length is fixed by its id
    shards = prompt_shards(2, 200)
    store = ShardStore(root)
    generate(url, root, max_tokens=40, shards=shards)
    low = pl.concat([store.read_shard(DS, DS, p) for p in shards])
    truncated = set(low.filter(pl.col("status") == "truncated")["prompt_id"])
    assert 0 < len(truncated) < low.height
    sent_before = dict(server.requests)

    reports = generate(url, root, max_tokens=80, shards=shards)

    high = pl.concat([store.read_shard(DS, DS, p) for p in shards])
    resent = {k.split("#")[0] for k, n in server.requests.items() if n > sent_before.get(k, 0)}
    assert resent == truncated
    assert set(high["status"]) == {"ok"} and high["config_hash"].n_unique() == 1
    kept = low.filter(pl.col("status") == "ok").select("prompt_id", "content", "finished_at")
    assert kept.join(high.select("prompt_id", "content", "finished_at"), on=kept.columns).height == kept.height
    assert sum(r.figures.counts.reused for r in reports.values()) == low.height - len(truncated)

    sent_before = dict(server.requests)
    generate(url, root, max_tokens=40, shards=shards)  # lowered back: rows made at 80 may exceed 40
    resent = {k.split("#")[0] for k, n in server.requests.items() if n > sent_before.get(k, 0)}
    assert resent == truncated


def test_resume_on_s3_reuses_every_finished_row(server: FakeOpenAI, s3_endpoint: str, s3_bucket: str) -> None:
    import boto3

    def s3() -> ShardStore:
        return ShardStore(f"s3://{s3_bucket}/run", lambda: boto3.client("s3", endpoint_url=s3_endpoint))

    url, shards = f"http://127.0.0.1:{server.port}/v1", prompt_shards(2, 50)
    engine = make_engine("openai", base_url=url, model="m")
    settings = RunnerSettings(flush_every_s=0.05, progress_bar=False)
    first = run_generation(engine, spec_for_tests(), shards, s3(), settings=settings, log=lambda _: None)
    again = run_generation(engine, spec_for_tests(), shards, s3(), settings=settings, log=lambda _: None)
    assert first["00001"].uri == f"s3://{s3_bucket}/run/{DS}/{DS}/00001.parquet"
    assert sum(r.figures.counts.reused for r in again.values()) == 100 and server.received == 100
    assert s3().read_shard(DS, DS, "00000").height == 50 and not s3().list(f"{DS}/{DS}/_log")
