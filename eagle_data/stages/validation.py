"""Stage 4, validation: token ids, loss masks and per-row verdicts for each generation shard, with its
quality record and HTML report.

Each generation shard is read only once its bytes are those generation stored (`storage.digests`). Each
validated shard is serialized once here, so its sha256 and size (in its quality record, its materialization
and its check evaluations) are those of exactly the bytes the IO manager then stores: the export's admission
reads only the bytes the checks judged."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import polars as pl

from eagle_data import layout, quality, report
from eagle_data.catalog import DatasetSpec, shard_index
from eagle_data.drafter.settings import load_drafter_settings
from eagle_data.engines.scoring import TargetIds, on_policy_column, resolve_scorer
from eagle_data.quality.decontam import benchmark_index, contamination
from eagle_data.quality.on_policy import SamplingPoint
from eagle_data.storage import ShardStore, digest, parquet_bytes
from eagle_data.storage.shards import SpilledShards
from eagle_data.targets import build_training_rows, load_target, resolve_target

Log = Callable[[str], None]


def target_name(spec: DatasetSpec, generations: pl.DataFrame) -> str:
    """The dataset's target profile; with `target = "auto"`, the one its served models map to (each row's
    `served_model`, else the `model` it asked for)."""
    columns = [generations[c].to_list() for c in ("served_model", "model") if c in generations.columns]
    models = [next((m for m in row if m), "") for row in zip(*columns, strict=True)]
    return resolve_target(spec.target, models)


def validated_rows(spec: DatasetSpec, generations: pl.DataFrame, partition: str) -> pl.DataFrame:
    """Token ids, loss masks and per-row verdicts for one generation shard; rows overlapping a benchmark
    (`contamination`: its name) get the verdict `contaminated`; every row names the tokenizer and chat
    template that made its ids (eagle_data.provenance); a sample of training rows carries the target's own
    score of them (`on_policy`, eagle_data/quality/on_policy.py)."""
    target = load_target(target_name(spec, generations))
    rows = build_training_rows(
        target, generations, thinking=spec.generation.thinking, mask_empty_think=spec.mask_empty_think
    )
    index, _ = benchmark_index(load_drafter_settings().decontamination)
    rows = rows.with_columns(
        pl.lit(shard_index(partition), pl.Int32).alias("shard"),
        contamination(rows, index),
        target=pl.lit(target.name),
        tokenizer_hash=pl.lit(target.tokenizer_hash),
        chat_template_hash=pl.lit(target.chat_template_hash),
    )
    rows = quality.row_verdicts(rows, spec.checks, thinking=spec.generation.thinking)
    g = spec.generation
    default, scorer = SamplingPoint(g.temperature, g.top_p, g.min_tokens), resolve_scorer(spec.on_policy, generations)
    return rows.with_columns(on_policy_column(rows, spec.on_policy, TargetIds.of(target), default, scorer))


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
    """What a validation run made, per partition: the quality record, with the sha256 of the shard's bytes
    (its materialization and check evaluations carry it, so the export reads only the bytes the checks judged),
    and those bytes, spilled to a local folder until the IO manager stores them."""

    records: dict[str, quality.ShardRecord] = field(default_factory=dict)
    report: report.DatasetReport | None = None  # the dataset page, with its headline figures
    rows: dict[str, int] = field(default_factory=dict)  # each shard's row count
    columns: dict[str, pl.DataType] = field(default_factory=dict)  # the shards' columns (the last one made)
    shards: SpilledShards = field(default_factory=SpilledShards)


def earlier_avg_completion_tokens(spec: DatasetSpec, store: ShardStore, key: str) -> float | None:
    """The shard's own average completion length when it was last validated (its stored quality record), which
    its length_shift check compares against; None for a shard never validated (or validated under other check
    definitions: its record is stale)."""
    path = layout.quality_record(spec.name, key)
    record = quality.ShardRecord.from_json(store.read_bytes(path)) if store.exists(path) else None
    return record.summary.avg_completion_tokens if record else None


def validate(
    spec: DatasetSpec,
    store: ShardStore,
    generations: Mapping[str, pl.DataFrame],
    *,
    workers: int | None = None,
    log: Log = print,
    run_id: str = "",
) -> Validation:
    """Build the validated shards of `generations` (partition -> frame, read when looked up) and write their
    HTML quality reports; returns each partition's quality record (summary, figures, check results and shard
    digest), the dataset report, and the shards' bytes.

    Shards are built in a pool of `workers` processes (default: every core, for runs of POOL_MIN_PROMPTS
    prompts or more) while this process reads them, at most two shards per worker in flight; a shard's
    result does not depend on where it was built, so any worker count makes the same bytes.
    Each shard's length_shift compares with that shard's own figure from its last validation; `run_id` (the
    Dagster run) is recorded in each quality record. A shard validated into the bytes it already had keeps the
    outcomes of the checks judged after validation (decontamination) on them.
    """
    partitions = list(generations)
    inputs = {key: report.inputs_for(spec, earlier_avg_completion_tokens(spec, store, key)) for key in partitions}
    done = Validation()

    def keep(rows: pl.DataFrame, record: quality.ShardRecord) -> None:
        done.rows[record.partition], done.columns = rows.height, dict(rows.schema)
        data = parquet_bytes(rows)
        done.shards.add(record.partition, data)
        record = replace(record, shard_sha256=digest(data), shard_size=len(data), run_id=run_id)
        # its page shows the outcomes judged after validation that still hold for these bytes
        record = replace(record, judged_after=report.judged_outcomes(store, spec.name, record.partition))
        report.write_shard_report(spec, store, record)
        done.records[record.partition] = record

    if workers is None:
        workers = cores() if len(partitions) * spec.shard_size >= POOL_MIN_PROMPTS else 1
    n = min(workers, len(partitions))
    if n <= 1:
        for key in partitions:
            keep(*check_shard(spec, generations[key], key, inputs[key]))
    else:  # spawn: a forked child of a threaded parent (Dagster, polars, tokenizers) can deadlock
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending: deque[Future[tuple[pl.DataFrame, quality.ShardRecord]]] = deque()
            for key in partitions:
                pending.append(pool.submit(check_shard, spec, generations[key], key, inputs[key]))
                if len(pending) >= 2 * n:
                    keep(*pending.popleft().result())
            while pending:
                keep(*pending.popleft().result())
    done.report = report.write_dataset_report(spec, store, log)
    return done
