"""What eagle_data reads from the Dagster instance, as plain records: the one module of eagle_data/defs
that imports `dagster._core`.

Dagster 1.13 has no public API for backfill records (`PartitionBackfill`, read and updated through the
instance), for a check's execution history (the event log storage's `get_asset_check_execution_history`, its
`AssetCheckExecutionRecord`: the canary's latest verdict, the alert sensor's failed checks), for the
materialization an evaluation names (`AssetCheckEvaluationTargetMaterializationData`, which the UI shows), for
concurrency-pool slots (the event log storage's concurrency methods) nor for wrapping the default executor
(`executor_creation_fn`, the `InitExecutorContext` named tuple's `_replace`); those uses live here, behind
named functions, as do the types other modules of `defs` name. The export's admission reads none of this:
the check outcomes and shard digests it judges are in the quality records on storage (`exports.gate_records`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG, ROOT_RUN_ID_TAG
from dagster._utils.error import SerializableErrorInfo as ErrorInfo

from eagle_data import quality

if TYPE_CHECKING:  # types only; Dagster exports none of these publicly in 1.13
    # the per-pool run-worker executor (pools.py) is built over the executor's internals
    from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph  # schedules.py
    from dagster._core.execution.context.system import PlanOrchestrationContext
    from dagster._core.execution.plan.plan import ExecutionPlan
    from dagster._core.execution.retries import RetryMode
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecord  # sensors.py too
    from dagster._utils.concurrency import ConcurrencyKeyInfo  # pool slots (pools.py)
    from dagster._utils.error import SerializableErrorInfo  # sensors.py: a step failure's error

__all__ = [
    "AssetCheckExecutionRecord",
    "BaseAssetGraph",
    "ConcurrencyKeyInfo",
    "ExecutionPlan",
    "PlanOrchestrationContext",
    "RetryMode",
    "SerializableErrorInfo",
]

_BATCH = 500  # storage ids per query: bounded IN lists for the event log's SQL
CANARY_HISTORY = 20  # canary executions read back for the latest evaluation (a run that died leaves none)
# The states of a check execution that carry a verdict; PLANNED (the step has not evaluated it yet, failed
# before it did, or its run died) carries an AssetCheckEvaluationPlanned, which has no verdict or metadata.
_JUDGED = frozenset({AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED})


def latest_materializations(
    instance: dg.DagsterInstance, key: dg.AssetKey, partitions: Iterable[str] | None = None
) -> dict[str, dg.EventLogRecord]:
    """partition -> the record of its latest materialization (of every partition, or of `partitions`)."""
    wanted = set(partitions) if partitions is not None else None
    latest = instance.get_latest_storage_id_by_partition(key, dg.DagsterEventType.ASSET_MATERIALIZATION, wanted)
    ids, found = sorted(latest.values()), {}
    for start in range(0, len(ids), _BATCH):
        batch = ids[start : start + _BATCH]
        records = dg.AssetRecordsFilter(asset_key=key, storage_ids=batch)
        page = instance.fetch_materializations(records, limit=len(batch))
        found |= {r.partition_key: r for r in page.records if r.partition_key is not None}
    return found


def target(record: dg.EventLogRecord | None) -> AssetCheckEvaluationTargetMaterializationData | None:
    """A materialization as the target an evaluation names (what the UI shows it judged)."""
    if record is None:
        return None
    return AssetCheckEvaluationTargetMaterializationData(
        run_id=record.run_id, storage_id=record.storage_id, timestamp=record.timestamp
    )


def judged(record: AssetCheckExecutionRecord) -> dg.AssetCheckEvaluation | None:
    """The verdict an execution record holds, or None for one that holds none (planned, never evaluated):
    the one reader of check executions, for every state Dagster records."""
    if record.status not in _JUDGED or record.event is None or record.event.dagster_event is None:
        return None
    evaluation = record.event.dagster_event.event_specific_data
    return evaluation if isinstance(evaluation, dg.AssetCheckEvaluation) else None


def latest_canary(instance: dg.DagsterInstance, key: dg.AssetCheckKey) -> quality.LatestCanary | None:
    """The latest verdict of a dataset's `canary` check, with the config hash it was judged under. An execution
    that holds no verdict (its estimate failed before judging, e.g. on a 401, or its run died) is passed over:
    it can neither lift a failed canary nor break a later run."""
    for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=CANARY_HISTORY):
        if (evaluation := judged(record)) is not None:
            config_hash = evaluation.metadata.get("config_hash")
            found = str(config_hash.value) if config_hash else ""
            return quality.LatestCanary(evaluation.passed, found, evaluation.description or "")
    return None




def failed_executions(
    instance: dg.DagsterInstance, key: dg.AssetCheckKey, limit: int
) -> list[AssetCheckExecutionRecord]:
    """The latest `limit` failed executions of one check, newest first."""
    failed = {AssetCheckExecutionRecordStatus.FAILED}
    return list(instance.event_log_storage.get_asset_check_execution_history(key, limit=limit, status=failed))


def failed_check_partitions(instance: dg.DagsterInstance, keys: Sequence[dg.AssetCheckKey]) -> set[str]:
    """Partitions where the latest execution of one of `keys` failed."""
    infos = instance.event_log_storage.get_asset_check_partition_info(list(keys)) if keys else []
    failed = AssetCheckExecutionRecordStatus.FAILED
    return {info.partition_key for info in infos if info.partition_key and info.latest_execution_status == failed}


def pool_infos(instance: dg.DagsterInstance, pools: Iterable[str]) -> Mapping[str, ConcurrencyKeyInfo]:
    """pool -> its slots: limit, the claimed ones (run, step) and the steps waiting."""
    return instance.event_log_storage.get_concurrency_infos(list(pools))


def pool_info(instance: dg.DagsterInstance, pool: str) -> ConcurrencyKeyInfo:
    return instance.event_log_storage.get_concurrency_info(pool)


def pool_names(instance: dg.DagsterInstance) -> set[str]:
    """Every pool the instance knows."""
    return instance.event_log_storage.get_concurrency_keys()


def supports_pools(instance: dg.DagsterInstance) -> bool:
    """Whether the instance's storage keeps pool slots (an in-memory test instance may not)."""
    return instance.event_log_storage.supports_global_concurrency_limits


def free_pool_slots(instance: dg.DagsterInstance, run_id: str) -> None:
    """Give back every pool slot `run_id` holds."""
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)


def default_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """Dagster's own multiprocess/in-process executor, built as Dagster builds it from the run config."""
    creation_fn = dg.multi_or_in_process_executor.executor_creation_fn
    assert creation_fn is not None  # a built-in executor always has one
    return creation_fn(init_context)


def with_executor_config(init_context: dg.InitExecutorContext, config: Mapping[str, Any]) -> dg.InitExecutorContext:
    """The same executor context under another executor config."""
    return init_context._replace(executor_config=config)


def add_partition_metadata(context: dg.OutputContext, metadata: Mapping[str, Any], partition: str) -> None:
    """Metadata on one partition's materialization, from an IO manager: an OutputContext's own
    `add_output_metadata` puts the same values on every partition of a range run."""
    context.step_context.add_asset_metadata(dict(metadata), asset_key=context.asset_key, partition_key=partition)


def latest_partition_metadata(
    instance: dg.DagsterInstance, key: dg.AssetKey, exclude: Collection[str]
) -> list[Mapping[str, dg.MetadataValue]]:
    """The metadata of each partition's latest materialization of `key`, but those in `exclude`: two queries."""
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        key, dg.DagsterEventType.ASSET_MATERIALIZATION
    )
    ids = [storage_id for partition, storage_id in latest.items() if partition not in exclude]
    if not ids:
        return []
    found = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, storage_ids=ids), limit=len(ids))
    return [record.asset_materialization.metadata for record in found.records if record.asset_materialization]


def succeeded_backfills(instance: dg.DagsterInstance, since: float) -> list[PartitionBackfill]:
    """The backfills created after `since` (a Unix time) that Dagster ended COMPLETED_SUCCESS ("Succeeded")."""
    created_after = datetime.fromtimestamp(since, tz=UTC)
    filters = BulkActionsFilter(statuses=[BulkActionStatus.COMPLETED_SUCCESS], created_after=created_after)
    return list(instance.get_backfills(filters=filters))


def unrecovered_failures(instance: dg.DagsterInstance, backfill_id: str) -> list[dg.DagsterRun]:
    """The backfill's failed runs that no re-execution (a run of the same root) has since brought to success."""
    runs = [r.dagster_run for r in instance.get_run_records(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))]
    root = {run.run_id: run.tags.get(ROOT_RUN_ID_TAG, run.run_id) for run in runs}
    recovered = {root[run.run_id] for run in runs if run.status == dg.DagsterRunStatus.SUCCESS}
    return [run for run in runs if run.status == dg.DagsterRunStatus.FAILURE and root[run.run_id] not in recovered]


def mark_backfill_failed(instance: dg.DagsterInstance, backfill: PartitionBackfill, why: str) -> None:
    """End `backfill` COMPLETED_FAILED ("Failed" in the UI) with `why` as its error, shown on its page."""
    failed = backfill.with_status(BulkActionStatus.COMPLETED_FAILED).with_error(ErrorInfo(why, [], None))
    instance.update_backfill(failed)
