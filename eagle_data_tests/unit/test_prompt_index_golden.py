"""The prompt index keeps its contents: same prompt ids, same shard contents, same skip counts as the
in-memory index it replaced, on every bundled sample and on a synthetic source with every kind of bad
row, a duplicate-heavy tail and the `max_prompts` cap falling mid-shard.

The expectation (golden/prompt_index.json) was frozen from the original in-memory implementation; it is
never regenerated from the code under test. Each shard is pinned by its prompt ids and a hash of its
rows (messages, source ids, source rows).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle_data import layout
from eagle_data.catalog import DatasetSpec, load_catalog
from eagle_data.storage import ShardStore
from eagle_data_tests import fixtures_stages as stage

GOLDEN = Path(__file__).parents[1] / "golden" / "prompt_index.json"
SPECS = load_catalog(profile="demo")


def synthetic_sharegpt(path: Path, rows: int = 400, seed: int = 7) -> Path:
    """A ShareGPT-schema JSONL file with every kind of bad row the adapter counts, and duplicates."""
    rnd = random.Random(seed)
    lines = []
    for i in range(rows):
        kind = rnd.random()
        turns = [{"from": "human", "value": f"question {rnd.randint(0, 60)} about {rnd.choice('abcdefgh')}"}]
        if rnd.random() < 0.5:
            turns.append({"from": "gpt", "value": f"answer {i}"})
            turns.append({"from": "human", "value": f"follow-up {i}"})
        row: dict[str, Any] = {"id": f"s{i}", "conversations": turns}
        if kind < 0.04:
            lines.append("{broken json")
            continue
        if kind < 0.08:
            row["conversations"] = [{"from": "robot", "value": "x"}]
        elif kind < 0.12:
            row["conversations"] = [{"from": "human", "value": ""}]
        elif kind < 0.15:
            row["conversations"] = [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]
        elif kind < 0.18:
            row["conversations"] = [{"from": "human", "value": "y" * 200}]
        elif kind < 0.2:
            row["conversations"] = [{"from": "system", "value": "be brief"}, *turns]
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def as_parquet(jsonl: Path) -> Path:
    """The parseable rows of a JSONL file as a parquet file (polars infers the struct schema)."""
    rows = []
    for line in jsonl.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    path = jsonl.with_suffix(".parquet")
    pl.DataFrame(rows).write_parquet(path, row_group_size=50)
    return path


def cases(tmp_path: Path) -> dict[str, DatasetSpec]:
    synthetic = synthetic_sharegpt(tmp_path / "synthetic.jsonl")
    # the demo profile's bundled samples at the 40-prompt cap the expectation was frozen with
    out = {name: spec.model_copy(update={"max_prompts": 40}) for name, spec in SPECS.items()}
    out["b7_sharegpt_capped"] = SPECS["b7_sharegpt"].model_copy(update={"max_prompts": 25, "shard_size": 7})
    out["synthetic"] = SPECS["b7_sharegpt"].model_copy(
        update={"source": str(synthetic), "max_prompts": 160, "shard_size": 25, "max_prompt_chars": 150}
    )
    out["synthetic_parquet"] = out["synthetic"].model_copy(update={"source": str(as_parquet(synthetic))})
    return out


def observe(spec: DatasetSpec, root: Path) -> dict[str, Any]:
    """What the prompts stage writes for every partition of `spec`, in comparable form."""
    store = ShardStore(str(root))
    written = stage.write_prompts(spec, store, spec.partition_keys)
    shards = {}
    for key in spec.partition_keys:
        frame = store.read_shard(spec.name, layout.prompts_asset(spec.name), key)
        rows = frame.select("prompt_id", "messages", "source_id", "source_row", "shard").to_dicts()
        shards[key] = {
            "prompt_ids": frame["prompt_id"].to_list(),
            "sha256": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest(),
        }
    return {
        "figures": {k: v for k, v in sorted(written.index.items()) if k != "source"},
        "prompts_per_shard": [written.prompts[key] for key in spec.partition_keys],
        "shards": shards,
    }


@pytest.mark.parametrize("case", [*SPECS, "b7_sharegpt_capped", "synthetic", "synthetic_parquet"])
def test_prompt_index_matches_the_frozen_expectation(tmp_path: Path, case: str) -> None:
    spec = cases(tmp_path)[case]
    expected = json.loads(GOLDEN.read_text())[case]
    assert observe(spec, tmp_path / "out") == expected
