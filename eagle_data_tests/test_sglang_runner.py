"""b7_sharegpt (bundled sample) through the runner and the SGLang engine, one of three servers killed."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter
from pathlib import Path

from eagle_data.catalog import load_catalog
from eagle_data.engines.launcher import LaunchConfig, Launcher
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.sources import build_index, source_location
from eagle_data.storage import ShardStore
from eagle_data_tests.servers.sglang_fake import free_port_block
from eagle_data_tests.test_sglang import FAKE, MODEL, REPO, engine


def answers_in(folder: Path) -> list[dict[str, object]]:
    files = sorted(folder.glob("answers-*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def kill_when(folder: Path, answered: int, pgid: int, stop: threading.Event) -> None:
    """SIGKILL process group `pgid` once the servers have answered `answered` requests."""
    while not stop.is_set():
        if len(answers_in(folder)) >= answered:
            os.killpg(pgid, signal.SIGKILL)
            return
        stop.wait(0.01)


def test_b7_sharegpt_through_three_servers_one_killed(tmp_path: Path) -> None:
    spec = load_catalog(profile="demo")["b7_sharegpt"]
    index = build_index(spec, source_location(spec))
    shards = {p: index.shard(spec, p) for p in spec.partition_keys}
    logs = tmp_path / "answers"
    logs.mkdir()
    config = LaunchConfig(
        model_path=MODEL, num_servers=3, base_port=free_port_block(3), command=FAKE,
        extra_args=("--delay", "0.1", "--log", str(logs / "answers-{port}.jsonl")),
        env={"PYTHONPATH": str(REPO)}, log_dir=str(tmp_path / "logs"), health_timeout_s=30,
    )
    store = ShardStore(str(tmp_path / "out"))
    with Launcher(config) as fleet:
        victim = fleet.servers[1]
        stop = threading.Event()
        killer = threading.Thread(target=kill_when, args=(logs, 15, victim.process.pid, stop))
        killer.start()
        eng = engine(fleet.urls, max_in_flight_per_server=3, max_new_tokens=spec.generation.max_tokens)
        settings = RunnerSettings(initial_in_flight=64, max_in_flight=64, progress_bar=False)
        try:
            reports = run_generation(eng, spec, shards, store, settings=settings, log=lambda _: None)
        finally:
            stop.set()
            killer.join()
        assert victim.process.poll() == -signal.SIGKILL  # it really died mid-run

    rows = [r for p in spec.partition_keys for r in store.read_shard(spec.name, spec.name, p).to_dicts()]
    answers = answers_in(logs)
    victim_port = config.base_port + 1
    survivor_rids = Counter(a["rid"] for a in answers if a["port"] != victim_port)
    sent = {}
    for a in answers:
        sent.setdefault(a["prompt_id"], []).append(a["output"])
    assert sorted(r["prompt_id"] for r in rows) == sorted(index.frame["prompt_id"])  # 0 lost, 0 twice
    assert {r["status"] for r in rows} <= {"ok", "truncated"}
    assert max(survivor_rids.values()) == 1  # no request answered twice by a live server
    for row in rows:
        turns = [m["output_ids"] for m in row["messages"] if m["role"] == "assistant"]
        assert turns and turns[-1] == row["output_ids"]
        assert all(ids in sent[row["prompt_id"]] for ids in turns)  # the servers' own tokens
    assert sum(r.figures["ok"] + r.figures["truncated"] for r in reports.values()) == len(rows)
    assert any(a["port"] == victim_port for a in answers)
    stats = eng.stats()  # still there after the runner closed the engine
    replies = sum(m["role"] == "assistant" for row in rows for m in row["messages"])
    assert stats["failovers"] >= 1 and stats["requests"] == replies and stats["servers_up"] == 2
