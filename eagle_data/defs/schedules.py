"""Nightly repair: re-materialize missing or failed partitions and re-run failed checks. Off by default.

Turn a dataset's schedule on in the UI (Automation tab) or with `dagster schedule start {ds}_nightly_repair`.
Each night it asks for one run per partition that needs work, at most `max_runs`:
- a partition some asset of the dataset has not materialized (missing, or its last run failed) gets its
  missing assets and everything downstream of them re-materialized (generation resumes from its
  durable log, so finished replies are not paid for twice);
- a materialized partition whose last ERROR check failed gets its checks re-run, and nothing
  downstream (useful after a threshold change in the catalog; a real regression fails again and
  alerts again, a daily reminder that the shard needs attention).
A dataset that was never materialized is left alone: starting one is a decision, not a repair.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from eagle_data import quality
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions
from eagle_data.defs.checks import check_keys, validated_key

NIGHTLY = "0 3 * * *"
_DONE = {dg.AssetPartitionStatus.MATERIALIZED, dg.AssetPartitionStatus.IN_PROGRESS}


def _missing(
    context: dg.ScheduleEvaluationContext, keys: Sequence[dg.AssetKey], spec: DatasetSpec
) -> dict[str, list[dg.AssetKey]]:
    """partition -> the dataset's assets that have not materialized it (and are not running it now)."""
    partitions_def = partitions(spec)
    missing: dict[str, list[dg.AssetKey]] = {}
    for key in keys:
        status = context.instance.get_status_by_partition(key, spec.partition_keys, partitions_def) or {}
        for partition in spec.partition_keys:
            if status.get(partition) not in _DONE:
                missing.setdefault(partition, []).append(key)
    return missing


def _failed_checks(context: dg.ScheduleEvaluationContext, spec: DatasetSpec) -> set[str]:
    """Partitions whose latest evaluation of an ERROR check failed (failed warnings only inform)."""
    errors = {d.name for d in quality.CHECKS if d.severity == "ERROR"}
    keys = [k for k in check_keys(spec) if k.name in errors]
    infos = context.instance.event_log_storage.get_asset_check_partition_info(keys)
    return {
        info.partition_key for info in infos if info.partition_key and info.latest_execution_status.value == "FAILED"
    }


def repair_schedule(spec: DatasetSpec, max_runs: int) -> dg.ScheduleDefinition:
    ds = spec.name
    group = dg.AssetSelection.groups(ds)

    @dg.schedule(
        name=f"{ds}_nightly_repair",
        cron_schedule=NIGHTLY,
        target=group,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"{spec.title}: nightly re-run of missing/failed partitions and failed checks (max {max_runs}).",
    )
    def nightly(context: dg.ScheduleEvaluationContext):
        graph = context.repository_def.asset_graph
        keys = sorted(group.resolve(graph), key=lambda k: k.to_user_string())
        missing = _missing(context, keys, spec)
        if len(missing) == len(spec.partition_keys) and all(len(v) == len(keys) for v in missing.values()):
            return dg.SkipReason(f"{ds} was never materialized: start it by hand, this schedule only repairs")
        night = context.scheduled_execution_time.strftime("%Y-%m-%d")
        failed_checks, validated = _failed_checks(context, spec), validated_key(spec)
        requests = []
        for partition in spec.partition_keys:
            bad = missing.get(partition, [])
            if partition in failed_checks and validated not in bad:  # never export past a failed gate
                requests.append(
                    dg.RunRequest(
                        run_key=f"{ds}-{partition}-checks-{night}",
                        partition_key=partition,
                        asset_selection=[],
                        asset_check_keys=check_keys(spec),
                    )
                )
            elif bad:
                selection = (dg.AssetSelection.assets(*bad).downstream() & group).resolve(graph)
                requests.append(
                    dg.RunRequest(
                        run_key=f"{ds}-{partition}-assets-{night}",
                        partition_key=partition,
                        asset_selection=sorted(selection, key=lambda k: k.to_user_string()),
                    )
                )
        return requests[:max_runs] or dg.SkipReason(f"{ds}: nothing to repair")

    return nightly


def build_schedules(specs: Sequence[DatasetSpec], max_runs: int = 20) -> list[dg.ScheduleDefinition]:
    """One stopped nightly repair schedule per dataset."""
    return [repair_schedule(spec, max_runs) for spec in specs]
