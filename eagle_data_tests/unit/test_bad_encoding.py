"""Text no file can hold (a lone surrogate escaped in JSON, `"\\ud800"`) costs one row, never a shard."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from eagle_data.catalog import load_catalog
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.resultlog import ResultLog, resume_key, turn_record
from eagle_data.sources import load_index
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.types import Completion

FAST = RunnerSettings(backoff_base_s=0.01, backoff_cap_s=0.1, progress_bar=False)
DS = "b7_sharegpt"


def _run(server: FakeOpenAI, root: Path, shards: dict) -> dict:
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=5.0)
    return run_generation(engine, spec_for_tests(), shards, ShardStore(str(root)), settings=FAST, log=lambda _: None)


def test_a_poison_reply_fails_its_row_and_every_shard_is_written_and_rerun_finishes(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    shards = prompt_shards(4, 15)
    server.faults = Faults(poison_prompts=("s3-p7",))
    _run(server, tmp_path, shards)
    store = ShardStore(str(tmp_path))
    last = store.read_shard(DS, DS, "00003")
    assert all(store.shard_exists(DS, DS, p) for p in shards)
    poisoned = last.row(by_predicate=pl.col("prompt_id") == "s3-p7", named=True)
    assert poisoned["status"] == "failed" and poisoned["error"].startswith("bad_encoding")
    assert (last["status"] == "ok").sum() == 14

    sent = server.received
    _run(server, tmp_path, shards)  # the re-run asks for the poisoned prompt alone, and writes its shard again
    assert server.received - sent == 1
    assert store.read_shard(DS, DS, "00003")["status"].to_list().count("failed") == 1


def test_a_poison_turn_stored_by_an_older_version_is_requested_again(server: FakeOpenAI, tmp_path: Path) -> None:
    shards = prompt_shards(1, 5)
    store, spec = ShardStore(str(tmp_path)), spec_for_tests()
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=5.0)
    key = resume_key(engine.config(), spec)
    poison = turn_record("s0-p0", 0, key, Completion(content="tok\ud800", reasoning="r"), 1, 0.1)
    ResultLog(store, DS, "00000", "old").append_turns([poison])
    _run(server, tmp_path, shards)
    out = store.read_shard(DS, DS, "00000")
    assert set(out["status"]) == {"ok"} and server.answered["s0-p0#1"] == 1


def test_a_lone_surrogate_in_a_source_prompt_is_a_counted_skip(tmp_path: Path) -> None:
    good = [{"conversations": [{"from": "human", "value": f"question {i}"}]} for i in range(12)]
    source = tmp_path / "src.jsonl"
    lines = [json.dumps(row) for row in good] + ['{"conversations": [{"from": "human", "value": "bad \\ud800"}]}']
    source.write_text("\n".join(lines) + "\n")
    spec = load_catalog(profile="demo")[DS].model_copy(update={"max_skipped_share": 0.5})
    index = load_index(spec, ShardStore(str(tmp_path / "out")), str(source))
    assert index.prompts == 12 and index.skipped == {"bad_encoding": 1}


def test_a_row_whose_error_text_cannot_be_stored_is_written_failed(tmp_path: Path) -> None:
    from eagle_data.runner.rows import build_row

    store = ShardStore(str(tmp_path))
    bad = build_row("p0", "failed", [], [], attempts=1, latency_s=0.1, error="body_error: \ud800", finished_at=1.0)
    good = build_row("p1", "ok", [], [Completion(content="fine")], attempts=1, latency_s=0.1, error="", finished_at=1.0)
    ResultLog(store, DS, "00000").finalize([bad, good], [], whole=True)
    out = store.read_shard(DS, DS, "00000")
    assert out["error"][0].startswith("bad_encoding") and out["content"].to_list() == ["", "fine"]
