"""b7_sharegpt (bundled sample) materialized through the SGLang resource, one of three servers killed."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from eagle_data.catalog import Breaker
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.engines.launcher import LaunchConfig, Launcher
from eagle_data.sources import load_index
from eagle_data.standins.sglang_fake import free_port_block
from eagle_data.storage import ShardStore
from eagle_data_tests.fixtures_stages import standin_demo
from eagle_data_tests.unit.test_sglang import FAKE, MODEL, REPO


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


def test_b7_sharegpt_materializes_through_the_sglang_resource_with_one_server_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLE_DATA_ENGINE", "sglang")  # the generation asset's pool is the environment's engine
    # The stand-in's replies are 2 to 30 random ids, short by design: the breaker would stop them.
    spec = standin_demo()["b7_sharegpt"].model_copy(  # Qwen's ids; every turn of 40 prompts: requests to fail over
        update={"breaker": Breaker(enabled=False), "max_prompts": 40, "regenerate": "all"}
    )
    index = load_index(spec, ShardStore(str(tmp_path / "index")))
    logs = tmp_path / "answers"
    logs.mkdir()
    config = LaunchConfig(
        model_path=MODEL, num_servers=3, base_port=free_port_block(3), command=FAKE,
        extra_args=("--delay", "0.1", "--log", str(logs / "answers-{port}.jsonl")),
        env={"PYTHONPATH": str(REPO)}, log_dir=str(tmp_path / "logs"), health_timeout_s=30,
    )  # fmt: skip
    storage = StorageResource(root=str(tmp_path / "out"))
    with Launcher(config) as fleet:
        victim = fleet.servers[1]
        stop = threading.Event()
        killer = threading.Thread(target=kill_when, args=(logs, 15, victim.process.pid, stop))
        killer.start()
        monkeypatch.setenv("EAGLE_DATA_BASE_URL", ",".join(fleet.urls))
        engine = EngineResource(kind="sglang", model=MODEL, max_in_flight=9)
        keys = spec.partition_keys
        try:
            result = dg.materialize(
                build_dataset_assets(spec),
                selection=dg.AssetSelection.all() - dg.AssetSelection.assets(f"{spec.name}_estimate"),
                resources={**shard_resources(storage), "engine": engine},
                instance=dg.DagsterInstance.ephemeral(),
                tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
            )
        finally:
            stop.set()
            killer.join()
        assert result.success
        assert victim.process.poll() == -signal.SIGKILL  # it really died mid-run

    store = storage.store()
    rows = [r for p in keys for r in store.read_shard(spec.name, spec.name, p).to_dicts()]
    answers = answers_in(logs)
    victim_port = config.base_port + 1
    survivor_rids = Counter(a["rid"] for a in answers if a["port"] != victim_port)
    sent: dict[str, list] = {}
    for a in answers:
        sent.setdefault(a["prompt_id"], []).append(a["output"])
    prompt_ids = sorted(pid for block in index.blocks() for pid in block["prompt_id"])
    assert sorted(r["prompt_id"] for r in rows) == prompt_ids  # 0 lost, 0 twice
    assert {r["status"] for r in rows} <= {"ok", "truncated"}
    assert max(survivor_rids.values()) == 1  # no request answered twice by a live server
    for row in rows:
        turns = [m["output_ids"] for m in row["messages"] if m["role"] == "assistant"]
        assert turns and turns[-1] == row["output_ids"]
        assert all(ids in sent[row["prompt_id"]] for ids in turns)  # the servers' own tokens
    assert any(a["port"] == victim_port for a in answers)
    generation = result.asset_materializations_for_node(spec.name)[0].metadata
    stats = generation["engine_stats"].value
    replies = sum(m["role"] == "assistant" for row in rows for m in row["messages"])
    assert stats["failovers"] >= 1 and stats["requests"] == replies and stats["servers_up"] == 2
    validated = pl.concat([store.read_shard(spec.name, f"{spec.name}_validated", p) for p in keys])
    assert validated.height == len(rows) and validated["structure_ok"].all() and validated["eot_ok"].all()
    by_id = {r["prompt_id"]: r["output_ids"] for r in rows}
    for prompt_id, input_ids in validated.select("prompt_id", "input_ids").iter_rows():
        own = by_id[prompt_id]  # the last reply, ending with <|im_end|>; ChatML's "\n" follows it
        assert input_ids[-len(own) - 1 : -1] == own
