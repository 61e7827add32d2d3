"""Asset checks of every catalog dataset: the quality gates of eagle_data.quality on `{ds}_validated`.

One multi-asset check per dataset runs every gate on the shard(s) of the run, so the validated frame is
read once; a range run is judged shard by shard (one bad shard cannot hide among good ones).
`empty_response` and `token_structure` are blocking: when one fails, the run fails and the exports
downstream do not run. Check metadata carries `figure`, `threshold` and `partitions`, which alerts quote.

The check can run a subset of its gates (`can_subset`), which is what lets the UI re-run checks from the
asset's Checks tab ("Execute all"). That button launches a run without a partition, where Dagster 1.13
cannot turn a partitioned check's result into an evaluation (docs/facts.md); such a run judges every
materialized shard on its own and reports one evaluation per gate and shard, each naming its shard and
the materialization it judged, so every shard's check status in the UI is current.
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
import io
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
import polars as pl
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData

from eagle_data import pipeline, quality
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions, previous_figure
from eagle_data.defs.resources import StorageResource
from eagle_data.report import partition_label
from eagle_data.storage import ShardStore, StorageError


def validated_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey(pipeline.validated_asset(spec))


def check_keys(spec: DatasetSpec) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(validated_key(spec), d.name) for d in quality.CHECKS]


def read_for_checks(store: ShardStore, spec: DatasetSpec, keys: Sequence[str]) -> Iterator[tuple[str, pl.DataFrame]]:
    """Validated shards one at a time, without token lists and conversations (the checks never read
    them), so a check over a long partition range stays small in memory."""
    asset = pipeline.validated_asset(spec)
    for key in keys:
        if not store.shard_exists(spec.name, asset, key):
            raise StorageError(f"{store.uri(store.shard_key(spec.name, asset, key))} does not exist: "
                               f"materialize {asset} partition {key} first")  # fmt: skip
        data = io.BytesIO(store.read_bytes(store.shard_key(spec.name, asset, key)))
        columns = [c for c in pl.read_parquet_schema(data) if c in quality.CHECK_COLUMNS]
        data.seek(0)
        yield key, pl.read_parquet(data, columns=columns)


def _outcome(key: dg.AssetKey, r: quality.CheckResult, partitions: str) -> dict[str, Any]:
    """What a check result and a check evaluation share."""
    return {
        "asset_key": key,
        "check_name": r.name,
        "passed": r.passed,
        "severity": dg.AssetCheckSeverity(r.severity),
        "description": r.message,
        "metadata": {**r.metadata(), "partitions": partitions},
    }


def to_result(key: dg.AssetKey, r: quality.CheckResult, partitions: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(**_outcome(key, r, partitions))


def materialization_of(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> Any:
    """The latest materialization of one partition, as an evaluation's target (None if there is none)."""
    page = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1)
    if not page.records:
        return None
    record = page.records[0]
    return AssetCheckEvaluationTargetMaterializationData(
        run_id=record.run_id, storage_id=record.storage_id, timestamp=record.timestamp
    )


def recheck_every_shard(
    context: dg.AssetCheckExecutionContext, spec: DatasetSpec, store: ShardStore, inputs: quality.Inputs
) -> Iterator[dg.AssetCheckEvaluation]:
    """A checks-only run without a partition: each materialized shard judged and reported on its own.
    A failed blocking gate fails the run, as it would in a materialization."""
    key = validated_key(spec)
    partitions = sorted(context.instance.get_materialized_partitions(key))
    if not partitions:
        raise dg.Failure(f"no partition of {key.to_user_string()} is materialized yet: materialize one first")
    selected, blocked = {k.name for k in context.selected_asset_check_keys}, []
    for partition, frame in read_for_checks(store, spec, partitions):
        target = materialization_of(context.instance, key, partition)
        for r in quality.run_checks(frame, inputs):
            if r.name in selected:
                yield dg.AssetCheckEvaluation(
                    **_outcome(key, r, partition), blocking=r.blocking, partition=partition,
                    target_materialization_data=target,
                )  # fmt: skip
                blocked += [f"{r.name} on {partition}"] if r.blocking and not r.passed else []
    if blocked:
        raise dg.Failure(f"blocking check(s) failed: {', '.join(blocked)}; see each shard's evaluation")


def dataset_checks(spec: DatasetSpec) -> dg.AssetChecksDefinition:
    key = validated_key(spec)
    specs = [
        dg.AssetCheckSpec(
            d.name, asset=key, description=d.description, blocking=d.blocking, partitions_def=partitions(spec)
        )
        for d in quality.CHECKS
    ]

    @dg.multi_asset_check(
        name=f"{spec.name}_quality_checks", specs=specs, can_subset=True, description=f"{spec.title}: quality gates."
    )
    def checks(context: dg.AssetCheckExecutionContext, storage: StorageResource):
        previous = previous_figure(context.instance, key, context.run.run_id)
        inputs = quality.Inputs(spec.checks, spec.generation.thinking, previous)
        if not (context.has_partition_key or context.has_partition_key_range):
            yield from recheck_every_shard(context, spec, storage.store(), inputs)
            return
        keys, selected = list(context.partition_keys), {k.name for k in context.selected_asset_check_keys}
        for r in quality.run_checks_by_shard(read_for_checks(storage.store(), spec, keys), inputs):
            if r.name in selected:
                yield to_result(key, r, partition_label(keys))

    return checks


def build_checks(specs: Sequence[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    """One multi-asset check per dataset, partitioned like the dataset's assets."""
    return [dataset_checks(spec) for spec in specs]
