"""Asset checks of every catalog dataset: the quality gates of eagle_data.quality on `{ds}_validated`.

Validation evaluates every gate once per shard and stores the results in the shard's quality record;
one multi-asset check per dataset reports those stored results (rebuilding a stale record from its
shard), so a check re-run never re-reads token ids. A range run is judged shard by shard (one bad shard
cannot hide among good ones).
The blocking gates (`empty_response`, `token_structure`, `lost_text`, `failed_rate`) fail the run when
one fails, and the exports downstream do not run. Check metadata carries `figure`, `threshold` and
`partitions`, which alerts quote.

The check can run a subset of its gates (`can_subset`), which is what lets the UI re-run checks from the
asset's Checks tab ("Execute all"). That button launches a run without a partition, where Dagster 1.13
cannot turn a partitioned check's result into an evaluation (docs/facts.md); such a run judges every
materialized shard on its own and reports one evaluation per gate and shard, each naming its shard and
the materialization it judged, so every shard's check status in the UI is current.
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData

from eagle_data import pipeline, quality, report
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions
from eagle_data.defs.resources import StorageResource
from eagle_data.report import partition_label
from eagle_data.storage import ShardStore


def validated_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey(pipeline.validated_asset(spec))


def check_keys(spec: DatasetSpec) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(validated_key(spec), d.name) for d in quality.CHECKS]


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


def failed_blocking_checks(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """Names of the blocking checks that failed in a run, by each evaluation's own blocking flag: every
    blocking check counts (the quality gates, the pre-flight `within_budget`, `decontamination`)."""
    events = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    evaluations = [e.dagster_event.event_specific_data for e in events]
    return [e.check_name for e in evaluations if e.blocking and not e.passed]


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
    context: dg.AssetCheckExecutionContext, spec: DatasetSpec, store: ShardStore
) -> Iterator[dg.AssetCheckEvaluation]:
    """A checks-only run without a partition: each materialized shard's stored results reported on their
    own. A failed blocking gate fails the run, as it would in a materialization."""
    key = validated_key(spec)
    partitions = sorted(context.instance.get_materialized_partitions(key))
    if not partitions:
        raise dg.Failure(f"no partition of {key.to_user_string()} is materialized yet: materialize one first")
    selected, blocked = {k.name for k in context.selected_asset_check_keys}, []
    for partition in partitions:
        target = materialization_of(context.instance, key, partition)
        for r in report.read_record(spec, store, partition, context.log.warning).results:
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
        store = storage.store()
        if not (context.has_partition_key or context.has_partition_key_range):
            yield from recheck_every_shard(context, spec, store)
            return
        keys, selected = list(context.partition_keys), {k.name for k in context.selected_asset_check_keys}
        results = {k: report.read_record(spec, store, k, context.log.warning).results for k in keys}
        for r in quality.combine(results):
            if r.name in selected:
                yield to_result(key, r, partition_label(keys))

    return checks


def build_checks(specs: Sequence[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    """One multi-asset check per dataset, partitioned like the dataset's assets."""
    return [dataset_checks(spec) for spec in specs]
