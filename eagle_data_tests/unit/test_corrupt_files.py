"""A corrupted shard or a garbage line in a turn log is named and set aside; resume goes on from what is durable."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eagle_data import layout
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.resultlog import ResultLog, resume_key, turn_record
from eagle_data.standins.openai_fake import FakeOpenAI, prompt_shards, spec_for_tests
from eagle_data.storage import CorruptFile, ShardStore
from eagle_data.types import Completion

DS = "b7_sharegpt"
FAST = RunnerSettings(backoff_base_s=0.01, backoff_cap_s=0.1, progress_bar=False)


def _run(server: FakeOpenAI, root: Path, shards: dict) -> None:
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=5.0)
    run_generation(engine, spec_for_tests(), shards, ShardStore(str(root)), settings=FAST, log=lambda _: None)


def test_a_corrupt_shard_is_named_and_moved_aside_and_the_resume_rebuilds_it(
    server: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shards = prompt_shards(1, 5)
    _run(server, tmp_path, shards)
    shard = tmp_path / DS / DS / "00000.parquet"
    shard.write_bytes(b"PAR1 torn by a disk fault")
    store = ShardStore(str(tmp_path))
    one_line = f"{shard} is not a readable parquet file .*: move it aside with `mv {shard} "
    with pytest.raises(CorruptFile, match=one_line):
        store.read_shard(DS, DS, "00000")  # what a downstream reader (validation) says: one line, the file named
    with caplog.at_level(logging.WARNING):
        _run(server, tmp_path, shards)
    assert set(store.read_shard(DS, DS, "00000")["status"]) == {"ok"}
    aside = [p for p in shard.parent.iterdir() if p.name.startswith("00000.parquet.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == b"PAR1 torn by a disk fault"  # kept, never deleted
    assert f"{shard} is not a readable parquet file" in caplog.text and str(aside[0]) in caplog.text


def test_a_garbage_line_in_a_turn_log_is_skipped_and_counted_and_the_rest_replayed(
    server: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shards, store, spec = prompt_shards(1, 5), ShardStore(str(tmp_path)), spec_for_tests()
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=5.0)
    key = resume_key(engine.config(), spec)
    turns = [turn_record(f"s0-p{i}", 0, key, Completion(content=f"stored {i}"), 1, 0.1) for i in range(4)]
    log = ResultLog(store, DS, "00000", "killed")
    log.append_turns(turns[:2])
    store.append_bytes(layout.turn_log(DS, "00000", "killed"), b'{"prompt_id":"s0-p2","tu')  # a kill mid-write
    log.append_turns(turns[3:])  # the next batch lands on the torn line
    with caplog.at_level(logging.WARNING):
        _run(server, tmp_path, shards)
    out = store.read_shard(DS, DS, "00000")
    assert set(out["status"]) == {"ok"} and out.filter(out["prompt_id"] == "s0-p0")["content"][0] == "stored 0"
    assert sorted(t.split("#")[0] for t in server.answered) == ["s0-p2", "s0-p3", "s0-p4"]
    assert f"{store.uri(layout.turn_log(DS, '00000', 'killed'))}: skipped 1 unreadable line(s) of 3" in caplog.text
