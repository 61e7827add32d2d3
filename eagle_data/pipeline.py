"""The three stages of a dataset as plain functions over shards: prompts, generation, validation.

What is left of the old hub while its stages move to eagle_data/stages/ (issue 33): preflight, estimate and
export are there already, and `estimate`/`config_hash` are imported here only for defs/assets.py.

Dagster assets (defs/assets.py) call these, so the stage logic exists once and runs without Dagster.
Each stage reads the previous stage's shards from the store and writes its own, one Parquet file per partition.
"""

from __future__ import annotations

import functools
import multiprocessing
import operator
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from eagle_data import layout, quality, report, sources
from eagle_data.catalog import DatasetSpec, shard_index, shard_key
from eagle_data.drafter.decontam import contamination
from eagle_data.drafter.evalsets import benchmark_index
from eagle_data.drafter.settings import load_drafter_settings
from eagle_data.quality.truncation import ReplyLengths, truncation_report
from eagle_data.quality.verdicts import ENGINE_SIDE_REJECTIONS
from eagle_data.runner import RunnerSettings, ShardFigures, mixture, run_generation
from eagle_data.stages.estimate import estimate  # noqa: F401  defs/assets.py calls pipeline.estimate until the merge
from eagle_data.stages.export import shards_written
from eagle_data.stages.preflight import check_server_template, config_hash, preflight, target_name  # noqa: F401
from eagle_data.storage import ShardStore, digest, parquet_bytes
from eagle_data.targets import build_training_rows, load_target
from eagle_data.types import Engine

Log = Callable[[str], None]


def prompts_asset(spec: DatasetSpec) -> str:
    return layout.prompts_asset(spec.name)


def validated_asset(spec: DatasetSpec) -> str:
    return layout.validated_asset(spec.name)


@dataclass(frozen=True)
class PromptsWritten:
    """What a prompts call wrote: each partition's prompt count, and the prompt index's figures (the
    whole source's, so they are not per shard and never add up)."""

    prompts: dict[str, int]
    index: dict[str, Any]

    def to_metadata(self) -> dict[str, Any]:
        return {"prompts": sum(self.prompts.values()), **self.index}


def write_prompts(
    spec: DatasetSpec,
    store: ShardStore,
    partitions: list[str],
    source_path: str | None = None,
    warn: Log = print,
) -> PromptsWritten:
    """Normalize the source once (the saved prompt index) and write the requested shards; returns each
    partition's prompt count and the index's figures (rows read, skipped by reason).

    When the source changed since the index was built, the index is rebuilt and `warn` names the prompt
    shards written from the old one that this call does not rewrite: they must be re-materialized."""
    index = sources.load_index(spec, store, source_path)
    if index.rebuilt:
        stale = sorted(set(shards_written(store, spec.name, prompts_asset(spec))) - set(partitions))
        redo = f"; re-materialize the {len(stale)} {prompts_asset(spec)} partitions cut from the old one"
        warn(f"{spec.name}: {index.rebuilt}; rebuilt it" + (f"{redo} ({stale[0]}...{stale[-1]})" if stale else ""))
    filled = -(-index.prompts // spec.shard_size)  # partitions the source's prompts fill
    empty = [key for key in partitions if shard_index(key) >= filled]
    if empty:
        raise sources.SourceError(
            f"dataset {spec.name!r}: the source yields {index.prompts:,} prompts, which fill partitions "
            f"{shard_key(0)}-{shard_key(filled - 1)}; {len(empty)} asked for ({empty[0]}...{empty[-1]}) would be "
            f"empty: set max_prompts to {index.prompts} for {spec.name} in the catalog and reload the definitions"
        )
    prompts = {}
    for key in partitions:
        shard = index.shard(spec, key)
        store.write_shard(spec.name, prompts_asset(spec), key, shard)
        prompts[key] = shard.height
    return PromptsWritten(
        prompts,
        {
            "prompts_in_source": index.prompts,
            "rows_read": index.rows_read,
            "skipped": sum(index.skipped.values()),
            **{f"skipped_{reason}": n for reason, n in index.skipped.items()},
            "source": index.source,
        },
    )


class PromptShards(Mapping[str, pl.DataFrame]):
    """A dataset's prompt shards, each read from the store only when looked up: the runner looks a shard
    up when it reaches it, so a range over 1,800 partitions never holds them all."""

    def __init__(self, spec: DatasetSpec, store: ShardStore, partitions: list[str]) -> None:
        self.spec, self.store, self.partitions = spec, store, partitions

    def __getitem__(self, key: str) -> pl.DataFrame:
        if key not in self.partitions:
            raise KeyError(key)
        return self.store.read_shard(self.spec.name, prompts_asset(self.spec), key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.partitions)

    def __len__(self) -> int:
        return len(self.partitions)


def generate(
    spec: DatasetSpec,
    store: ShardStore,
    partitions: list[str],
    engine: Engine,
    log: Log = print,
    settings: RunnerSettings | None = None,
    retry_rejected: bool = False,
    run_id: str = "",
) -> tuple[dict[str, Any], dict[str, ShardFigures]]:
    """Regenerate every reply of the requested shards; returns the run's metadata (the shards' figures
    added up, see `ShardFigures`) and each partition's own figures. With `retry_rejected`, rows the last
    validation rejected for engine-side reasons are requested again instead of reused. `run_id` names the
    run in shard leases.

    Also warns when more replies hit max_tokens than the catalog allows, with the max_tokens that would
    have covered 95% of them, and adds the engine's own figures (e.g. per SGLang server) when it has any.
    """
    preflight(spec, store, engine.model, engine.name)
    prompts = PromptShards(spec, store, partitions)
    check_server_template(spec, engine, prompts, log)
    redo = {key: engine_side_rejections(spec, store, key) for key in partitions} if retry_rejected else {}
    if redo:
        log(f"{spec.name}: re-requesting {sum(map(len, redo.values()))} rows rejected for engine-side reasons")
    lengths = ReplyLengths()
    reports = run_generation(
        engine, spec, prompts, store, settings=settings, log=log, lengths=lengths,
        run_id=run_id, redo=redo,
    )  # fmt: skip
    per_partition = {key: report.figures for key, report in reports.items()}
    figures = functools.reduce(operator.add, per_partition.values()).to_metadata()
    cut = truncation_report(
        lengths, max_new_tokens=spec.generation.max_tokens, threshold=spec.checks.max_truncated_share
    )
    figures.update(truncation_p95_tokens=cut.p95_tokens, suggested_max_tokens=cut.suggested_max_tokens)
    if spec.generation.mixture:  # the sampling settings the written rows were made with, against the weights
        figures.update(mixture.realized(settings_used(spec, store, partitions), spec.generation.mixture))
    if cut.warning:
        log(f"WARNING {spec.name}: {cut.warning}")
        figures["truncation_warning"] = cut.warning
    if stats := engine.stats():
        figures["engine_stats"] = stats
    return figures, per_partition


def engine_side_rejections(spec: DatasetSpec, store: ShardStore, partition: str) -> set[str]:
    """prompt_ids of a partition's validated shard whose verdict is an engine-side rejection."""
    if not store.shard_exists(spec.name, validated_asset(spec), partition):
        return set()
    verdicts = store.read_shard(spec.name, validated_asset(spec), partition).select("prompt_id", "verdict")
    return set(verdicts.filter(pl.col("verdict").is_in(list(ENGINE_SIDE_REJECTIONS)))["prompt_id"])


def settings_used(spec: DatasetSpec, store: ShardStore, partitions: list[str]) -> list[str]:
    """The `sampling_setting` of every row of the written generation shards (one column read per shard)."""
    names: list[str] = []
    for key in partitions:
        if store.shard_exists(spec.name, spec.name, key):
            names += store.read_shard(spec.name, spec.name, key, ["sampling_setting"])["sampling_setting"].to_list()
    return names


def validated_rows(spec: DatasetSpec, generations: pl.DataFrame, partition: str) -> pl.DataFrame:
    """Token ids, loss masks and per-row verdicts for one generation shard; rows overlapping a benchmark
    (`contamination`: its name) get the verdict `contaminated`; every row names the tokenizer and chat
    template that made its ids (eagle_data.provenance)."""
    target = load_target(target_name(spec, generations))
    rows = build_training_rows(
        target, generations, thinking=spec.generation.thinking, mask_empty_think=spec.mask_empty_think
    )
    index, _ = benchmark_index(load_drafter_settings().decontamination)
    rows = rows.with_columns(
        pl.lit(shard_index(partition), pl.Int32).alias("shard"),
        contamination(rows, index),
        tokenizer_hash=pl.lit(target.tokenizer_hash),
        chat_template_hash=pl.lit(target.chat_template_hash),
    )
    return quality.row_verdicts(rows, spec.checks, thinking=spec.generation.thinking)


def check_shard(
    spec: DatasetSpec, generations: pl.DataFrame, key: str, inputs: quality.Inputs
) -> tuple[pl.DataFrame, quality.ShardRecord]:
    """One shard's validated rows and quality record: pure CPU work, no storage, so it runs in any process."""
    rows = validated_rows(spec, generations, key)
    return rows, quality.shard_record(key, rows, inputs)


# A pool worker's start (imports, loading the target's tokenizer: 3-10 CPU-seconds) costs as much as
# validating 500-1,500 prompts, so runs under this size validate in this process unless workers are asked.
POOL_MIN_PROMPTS = 5_000


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Validation:
    """What a validation run wrote, per partition: the quality record, with the sha256 of the shard's bytes
    (its materialization and check evaluations carry it, so the export reads only the bytes the checks judged)."""

    records: dict[str, quality.ShardRecord] = field(default_factory=dict)
    report: report.DatasetReport | None = None  # the dataset page, with its headline figures
    rows: dict[str, int] = field(default_factory=dict)  # each shard's row count
    columns: dict[str, pl.DataType] = field(default_factory=dict)  # the shards' columns (the last one written)


def validate(
    spec: DatasetSpec,
    store: ShardStore,
    partitions: list[str],
    previous_avg_completion_tokens: float | None = None,
    *,
    workers: int | None = None,
    log: Log = print,
) -> Validation:
    """Build and write the validated shards and their HTML quality reports; returns each partition's
    quality record (summary, figures, check results and shard digest), and the dataset report's URI.

    Shards are built in a pool of `workers` processes (default: every core, for runs of POOL_MIN_PROMPTS
    prompts or more) while this process reads and writes them, at most two shards per worker in flight;
    a shard's result does not depend on where it was built, so any worker count writes the same bytes.
    `previous_avg_completion_tokens` (the last materialization's) feeds the length-shift check.
    """
    inputs = report.inputs_for(spec, previous_avg_completion_tokens)
    done = Validation()

    def keep(rows: pl.DataFrame, record: quality.ShardRecord) -> None:
        done.rows[record.partition], done.columns = rows.height, dict(rows.schema)
        data = parquet_bytes(rows)
        store.write_bytes(layout.shard(spec.name, validated_asset(spec), record.partition), data)
        record = replace(record, shard_sha256=digest(data))
        report.write_shard_report(spec, store, record)
        done.records[record.partition] = record

    if workers is None:
        workers = cores() if len(partitions) * spec.shard_size >= POOL_MIN_PROMPTS else 1
    n = min(workers, len(partitions))
    if n <= 1:
        for key in partitions:
            keep(*check_shard(spec, store.read_shard(spec.name, spec.name, key), key, inputs))
    else:  # spawn: a forked child of a threaded parent (Dagster, polars, tokenizers) can deadlock
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending: deque[Future[tuple[pl.DataFrame, quality.ShardRecord]]] = deque()
            for key in partitions:
                pending.append(pool.submit(check_shard, spec, store.read_shard(spec.name, spec.name, key), key, inputs))
                if len(pending) >= 2 * n:
                    keep(*pending.popleft().result())
            while pending:
                keep(*pending.popleft().result())
    done.report = report.write_dataset_report(spec, store, log)
    return done
