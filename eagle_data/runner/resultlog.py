"""The durable result log: what makes resume exact.

Finished rows are appended to checkpoint parts `{ds}/{ds}/_log/{partition}/part-*.parquet` at least
every `flush_every_s`; a finished shard is written whole to `{ds}/{ds}/{partition}.parquet` and its
parts are then deleted. A row counts as done only once it is in a part or the shard file, so a run
killed with SIGKILL loses at most the last unflushed seconds, and re-sends only those prompts.

Resume key: prompt_id + `config_hash` (engine config, sampling, max tokens, reasoning, routing,
regenerate/max_turns). A stored row is reused when
  - its `config_hash` equals the current one and it is ok or truncated (final under that config), or
  - it is ok, its `base_hash` (the same config without max tokens) matches, and it was generated with
    `max_tokens` <= the current cap: a reply that stopped on its own under a lower cap is exactly
    what the higher cap would allow, so raising max_tokens re-generates only the truncated rows.
Failed and skipped_budget rows are never reused: the next run retries them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.runner.rows import GENERATION_SCHEMA, Row, to_frame
from eagle_data.storage import ShardStore

MAX_TOKENS_KEYS = ("max_tokens", "max_new_tokens", "max_completion_tokens")


@dataclass(frozen=True)
class ResumeKey:
    config_hash: str
    base_hash: str
    max_tokens: int


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resume_key(engine_config: dict[str, Any], spec: DatasetSpec) -> ResumeKey:
    """Hash of everything that changes the output; `base_hash` leaves out the max-tokens cap."""
    generation = spec.generation.model_dump()
    payload = {
        "engine": engine_config,
        "generation": generation,
        "regenerate": spec.regenerate,
        "max_turns": spec.max_turns,
    }
    base = {
        **payload,
        "engine": {k: v for k, v in engine_config.items() if k not in MAX_TOKENS_KEYS},
        "generation": {k: v for k, v in generation.items() if k not in MAX_TOKENS_KEYS},
    }
    cap = next((int(engine_config[k]) for k in MAX_TOKENS_KEYS if k in engine_config), spec.generation.max_tokens)
    return ResumeKey(_digest(payload), _digest(base), cap)


def reusable(frame: pl.DataFrame, key: ResumeKey) -> pl.DataFrame:
    """The stored rows the current config may keep: the latest reusable row per prompt_id."""
    same = (pl.col("config_hash") == key.config_hash) & pl.col("status").is_in(["ok", "truncated"])
    raised = (
        (pl.col("status") == "ok") & (pl.col("base_hash") == key.base_hash) & (pl.col("max_tokens") <= key.max_tokens)
    )
    return (
        frame.filter(same | raised)
        .sort("finished_at")
        .unique("prompt_id", keep="last", maintain_order=True)
        .with_columns(pl.lit(key.config_hash).alias("config_hash"))
    )


class ResultLog:
    """Checkpoint parts and the final shard of one partition."""

    def __init__(self, store: ShardStore, dataset: str, partition: str) -> None:
        self.store, self.dataset, self.partition = store, dataset, partition
        self.prefix = layout.log_prefix(dataset, partition)
        self._seq = 0

    def load(self) -> pl.DataFrame:
        """Every stored row of this partition: the last final shard plus all checkpoint parts."""
        frames = [self.store.read_frame(k) for k in self.store.list(self.prefix)]
        if self.store.shard_exists(self.dataset, self.dataset, self.partition):
            frames.append(self.store.read_shard(self.dataset, self.dataset, self.partition))
        frames = [f.select([c for c in GENERATION_SCHEMA if c in f.columns]) for f in frames]
        return pl.concat(frames, how="diagonal_relaxed") if frames else to_frame([])

    def write_part(self, rows: list[Row]) -> str:
        """Make `rows` durable (blocking: call it off the event loop)."""
        self._seq += 1
        key = layout.log_part(self.dataset, self.partition, time.time_ns(), os.getpid(), self._seq)
        return self.store.write_frame(key, to_frame(rows))

    def finalize(self, frame: pl.DataFrame) -> str:
        """Write the whole shard and its usage sidecar, then drop the parts it supersedes (blocking)."""
        parts = self.store.list(self.prefix)
        uri = self.store.write_shard(self.dataset, self.dataset, self.partition, frame)
        usage = {"tokens": _tokens(frame), "cost_usd": float(frame["cost_usd"].sum())}
        self.store.write_bytes(layout.usage(self.dataset, self.partition), json.dumps(usage).encode())
        for key in parts:
            self.store.delete(key)
        return uri


def _tokens(frame: pl.DataFrame) -> int:
    return int(frame["prompt_tokens"].sum() + frame["completion_tokens"].sum())


def stored_usage(store: ShardStore, dataset: str, skip_partitions: set[str]) -> tuple[int, float]:
    """Tokens and dollars stored for `dataset` outside `skip_partitions`: budgets are per dataset.

    Finished shards count through their small usage sidecar (no shard download per call on S3);
    checkpoint parts of unfinished shards are read.
    """
    tokens, usd = 0, 0.0
    for key in store.list(layout.asset_prefix(dataset, layout.generation_asset(dataset))):
        where = layout.parse(key)
        if where is None or where.partition in skip_partitions:
            continue
        if where.kind == "usage":
            usage = json.loads(store.read_bytes(key))
            tokens, usd = tokens + usage["tokens"], usd + usage["cost_usd"]
        elif where.kind == "log_part":
            frame = store.read_frame(key)
            tokens, usd = tokens + _tokens(frame), usd + float(frame["cost_usd"].sum())
    return tokens, usd
