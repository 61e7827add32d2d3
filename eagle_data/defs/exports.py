"""The exports: per-dataset conversations JSONL and tokenized parquet, and the weighted training mix.

Downstream of every `{ds}_validated`, so a failed blocking check stops it in the same run. A blocking
check only stops steps of its own run, so the export also holds the gate across runs: it reads only the
validated shards whose latest evaluation of every blocking check passed on that shard's latest
materialization (`admission`), and names every shard it leaves out, with the reason.
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections.abc import Sequence

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluation
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import AssetCheckPartitionInfo

from eagle_data import exports, pipeline
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import SHARD_DIGEST, catalog_labels
from eagle_data.defs.checks import validated_key
from eagle_data.defs.messages import file_locations, leveled, uri_locations
from eagle_data.defs.resources import StorageResource
from eagle_data.storage import ShardStore


class ExportConfig(dg.Config):
    seed: int = 0  # the mix's shuffle and sub-sampling; the same seed gives the same rows


RunEvaluations = dict[str, tuple[int, AssetCheckEvaluation]]  # check name -> (storage id, evaluation)


def _evaluated_latest(info: AssetCheckPartitionInfo) -> bool:
    """The evaluation judged the shard's latest materialization. Evaluations logged without their target
    (by an op) count when they came after that materialization."""
    if info.latest_target_materialization_storage_id is not None:
        return info.latest_target_materialization_storage_id == info.latest_materialization_storage_id
    return info.latest_check_event_storage_id > (info.latest_materialization_storage_id or 0)


def _said(evaluation: AssetCheckEvaluation | None) -> str:
    """The first line of an evaluation's description, after a colon; "" without one."""
    return f": {evaluation.description.splitlines()[0]}" if evaluation and evaluation.description else ""


def _failure(instance: dg.DagsterInstance, info: AssetCheckPartitionInfo) -> str:
    """`{check} failed`, with the evaluation's own description."""
    history = instance.event_log_storage.get_asset_check_execution_history(
        info.check_key, limit=1, partition_filter=PartitionKeyFilter(key=info.partition_key)
    )
    return f"{info.check_key.name} failed" + _said(history[0].evaluation if history else None)


def _range_evaluations(instance: dg.DagsterInstance, key: dg.AssetKey, run_id: str) -> RunEvaluations:
    """check name -> (storage id, evaluation) of the evaluations a run made for its whole partition range
    (recorded without a partition: the run's partitions stay PLANNED in the check's per-partition rows)."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    evaluations = ((r.storage_id, r.event_log_entry.dagster_event.event_specific_data) for r in records)
    return {e.check_name: (sid, e) for sid, e in evaluations if e.asset_key == key and e.partition is None}


def _range_reason(info: AssetCheckPartitionInfo, evaluations: RunEvaluations) -> str | None:
    """Why a range run's evaluation keeps the shard out, or None. It passed only if it passed on every
    shard of the range; a failed one names its failing shards (`failing_shards`), the others passed."""
    name, run = info.check_key.name, info.latest_planned_run_id[:8]
    if name not in evaluations:
        return f"{name} has no result for this shard (run {run} did not finish it); re-run the checks"
    storage_id, evaluation = evaluations[name]
    if storage_id < (info.latest_materialization_storage_id or 0):
        return f"{name} last ran on an earlier materialization of this shard; re-run the checks"
    failing = evaluation.metadata.get("failing_shards")
    if evaluation.passed or (failing is not None and info.partition_key not in str(failing.value).split(",")):
        return None
    return f"{name} failed in run {run}" + _said(evaluation)


def _reason(
    instance: dg.DagsterInstance, info: AssetCheckPartitionInfo, ranges: dict[str, RunEvaluations]
) -> str | None:
    """Why a blocking check keeps its shard out of the export, or None when it lets it in."""
    status = info.latest_execution_status.value
    if status == "PLANNED":
        run = info.latest_planned_run_id
        if run not in ranges:
            ranges[run] = _range_evaluations(instance, info.check_key.asset_key, run)
        return _range_reason(info, ranges[run])
    if not _evaluated_latest(info):
        return f"{info.check_key.name} last ran on an earlier materialization of this shard; re-run the checks"
    return _failure(instance, info) if status == "FAILED" else None


def admission(
    instance: dg.DagsterInstance, store: ShardStore, spec: DatasetSpec, blocking: Sequence[dg.AssetCheckKey]
) -> exports.Admission:
    """Which validated shards of `spec` the export may read: written, materialized in this instance, and
    passed by the latest evaluation of every `blocking` check on that very materialization; with the
    digest of the bytes that materialization judged, which the export compares with what it reads."""
    key = validated_key(spec)
    on_storage = set(pipeline.shards_written(store, spec.name, pipeline.validated_asset(spec)))
    materialized = instance.get_materialized_partitions(key)
    candidates = sorted(on_storage | materialized)
    infos = {
        (info.check_key.name, info.partition_key): info
        for info in instance.event_log_storage.get_asset_check_partition_info(list(blocking), partition_keys=candidates)
    }
    admitted, excluded, ranges = [], {}, {}  # ranges: run id -> that run's range evaluations
    for partition in candidates:
        found = [infos.get((check.name, partition)) for check in blocking]
        if partition not in on_storage:
            excluded[partition] = "its shard file is missing from storage; re-materialize it"
        elif partition not in materialized:
            excluded[partition] = "this Dagster instance has no materialization of it; materialize it here"
        elif unchecked := [c.name for c, info in zip(blocking, found, strict=True) if info is None]:
            excluded[partition] = f"{', '.join(unchecked)} never ran on this shard; run the checks"
        elif reasons := [r for info in found if info and (r := _reason(instance, info, ranges))]:
            excluded[partition] = "; ".join(reasons)
        else:
            admitted.append(partition)
    latest = {partition: info.latest_materialization_storage_id for (_, partition), info in infos.items()}
    digests = judged_digests(instance, key, [latest[p] for p in admitted if latest.get(p) is not None])
    for partition in [p for p in admitted if p not in digests]:
        excluded[partition] = "its materialization has no shard digest (an older version made it); re-materialize it"
        admitted.remove(partition)
    return exports.Admission(tuple(admitted), excluded, digests)


def judged_digests(instance: dg.DagsterInstance, key: dg.AssetKey, storage_ids: Sequence[int]) -> dict[str, str]:
    """partition -> the shard digest its materialization (one of `storage_ids`) recorded."""
    digests = {}
    for start in range(0, len(storage_ids), 500):  # bounded IN lists for the event log's SQL
        ids = storage_ids[start : start + 500]
        found = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, storage_ids=ids), limit=len(ids))
        for record in found.records:
            materialization = record.asset_materialization
            value = materialization.metadata.get(SHARD_DIGEST) if materialization else None
            if materialization and materialization.partition and value is not None:
                digests[materialization.partition] = str(value.value)
    return digests


def build_exports(specs: Sequence[DatasetSpec], checks: Sequence[dg.AssetChecksDefinition]) -> dg.AssetsDefinition:
    """The `training_mix` asset over `specs`, gated by every blocking check among `checks`."""
    blocking = [check.key for c in checks for check in c.check_specs if check.blocking]
    gated_by = {spec.name: [k for k in blocking if k.asset_key == validated_key(spec)] for spec in specs}

    @dg.asset(
        name="training_mix",
        group_name="exports",
        deps=[pipeline.validated_asset(spec) for spec in specs],
        kinds={"parquet", "json"},
        **catalog_labels(
            "export",
            (o for spec in specs for o in spec.owners),
            "SpecForge conversations JSONL and tokenized parquet per dataset, and the weighted mix (catalog "
            "mix_weight) of every training row of the shards that passed their blocking checks.",
        ),
    )
    def training_mix(
        context: dg.AssetExecutionContext, config: ExportConfig, storage: StorageResource
    ) -> dg.MaterializeResult:
        store = storage.store()
        gate = {spec.name: admission(context.instance, store, spec, gated_by[spec.name]) for spec in specs}
        try:
            figures = pipeline.export(list(specs), store, gate, seed=config.seed, log=leveled(context.log))
        except exports.ExportError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        if "excluded" in figures:
            figures["excluded"] = dg.MetadataValue.md(figures["excluded"])
        files = {f"{spec.name}_{kind}": key for spec in specs if f"{spec.name}_rows" in figures
                 for kind, key in zip(("conversations", "train"), pipeline.export_keys(spec), strict=True)}  # fmt: skip
        figures.update({**uri_locations(store, figures), **file_locations(store, files)})
        return dg.MaterializeResult(metadata=figures)

    return training_mix
