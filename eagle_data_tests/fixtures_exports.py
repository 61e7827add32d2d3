"""Synthetic `{ds}_validated` shards for the export tests, and digests of what an export wrote.

The shards are deterministic (seeded), shaped like the validation stage's output: token ids and loss
masks, verification flags, the columns the verdicts read, a per-row verdict, and the conversation the
JSONL export reads. The digests
let a test compare an export with outputs frozen from an earlier implementation without storing them.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import polars as pl

from eagle_data import layout
from eagle_data.catalog import Adapter, DatasetSpec, Generation
from eagle_data.storage import ShardStore
from eagle_data.targets.rows import MESSAGE_DTYPE

# name -> (shards, mix weight); 10 shards of 500 rows = the 5k fixture
FIXTURE_DATASETS = {"b91_alpha": (6, 0.5), "b92_beta": (3, 2.5), "b93_gamma": (1, 1.0)}
SHARD_ROWS = 500
PROMPTS_FILE = "prompts.jsonl"  # the default trainer file (SpecForge data.prompts_path)


def fixture_specs() -> list[DatasetSpec]:
    return [
        DatasetSpec(name=name, title=name, adapter=Adapter(prompt_field="q"), max_prompts=shards * SHARD_ROWS,
                    shard_size=SHARD_ROWS, mix_weight=weight, target="qwen3-test",
                    generation=Generation(thinking=False))
        for name, (shards, weight) in FIXTURE_DATASETS.items()
    ]  # fmt: skip


def validated_shard(dataset: str, shard: int, rows: int = SHARD_ROWS) -> pl.DataFrame:
    """One validated shard: mostly passing rows, some truncated, some set aside with a reason."""
    rng = random.Random(f"{dataset}:{shard}")
    records = []
    for i in range(rows):
        n = rng.randint(24, 96)
        answer = rng.randint(17, n - 4)  # loss-mask sum above the default min_loss_tokens (16)
        verdict = rng.choices(["pass", "truncated", "short_loss", "failed"], weights=[85, 7, 5, 3])[0]
        content = f"answer {dataset} {shard} {i} " + "é" * rng.randint(0, 3)
        status = {"truncated": "truncated", "failed": "failed"}.get(verdict, "ok")
        records.append(
            {
                "prompt_id": f"{dataset}-{shard:05d}-{i:04d}",
                "dataset": dataset,
                "shard": shard,
                "messages": [
                    {"role": "user", "content": f"question {i} <|im_end|>?", "reasoning": None, "output_ids": None},
                    {"role": "assistant", "content": content, "reasoning": "think" * (i % 3), "output_ids": None},
                ],
                "status": status,
                "finish_reason": "length" if status == "truncated" else "stop",
                "content": content,
                "reasoning": "think" * (i % 3),
                "completion_tokens": answer,
                "special_in_text": 0,
                "ids_match": True,
                "input_ids": [rng.randrange(151_000) for _ in range(n)],
                "loss_mask": [0] * (n - answer) + [1] * answer,
                "num_tokens": n,
                "loss_tokens": answer,
                "structure_ok": True,
                "roundtrip_ok": True,
                "prefix_ok": True,
                "eot_ok": verdict != "truncated",
                "target_error": "",
                "verdict": verdict,
            }
        )
    schema = {"messages": pl.List(MESSAGE_DTYPE), "input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8),
              "shard": pl.Int32, "num_tokens": pl.Int32, "loss_tokens": pl.Int32}  # fmt: skip
    return pl.DataFrame(records, schema_overrides=schema)


def write_fixture(store: ShardStore) -> list[DatasetSpec]:
    """Every fixture shard written where the validation stage writes it; returns the specs."""
    for name, (shards, _) in FIXTURE_DATASETS.items():
        for shard in range(shards):
            store.write_shard(name, layout.validated_asset(name), f"{shard:05d}", validated_shard(name, shard))
    return fixture_specs()


def rows_digest(frame: pl.DataFrame) -> str:
    """sha256 over the rows in order: prompt id, dataset, token ids, loss mask."""
    digest = hashlib.sha256()
    for row in frame.select("prompt_id", "dataset", "input_ids", "loss_mask").iter_rows():
        digest.update(json.dumps(row).encode())
    return digest.hexdigest()


def export_digests(root: Path, datasets: list[str]) -> dict[str, dict[str, object]]:
    """What an export wrote under `root`: row counts, digests and the first prompt ids, per file."""
    out: dict[str, dict[str, object]] = {}
    for name in datasets:
        train = pl.read_parquet(root / layout.export_file(name, layout.TRAIN_FILE))
        jsonl = (root / layout.export_file(name, PROMPTS_FILE)).read_bytes()
        out[name] = {"rows": train.height, "train_sha256": rows_digest(train),
                     "prompts_sha256": hashlib.sha256(jsonl).hexdigest()}  # fmt: skip
    mixed = pl.read_parquet(root / layout.mix())
    out["mix"] = {"rows": mixed.height, "sha256": rows_digest(mixed),
                  "first_ids": mixed["prompt_id"].head(8).to_list()}  # fmt: skip
    prompts = pl.read_ndjson(root / layout.mix_file(PROMPTS_FILE))
    assert prompts["id"].to_list() == mixed["prompt_id"].to_list()  # the mix's prompts.jsonl: the mix, in order
    return out
