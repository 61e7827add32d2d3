"""Nightly repair: re-materialize missing or failed partitions and re-run failed checks. Off by default.

Turn a dataset's schedule on in the UI (Automation tab) or with `dagster schedule start {ds}_nightly_repair`.
Each night it asks for one run per range of consecutive partitions that need the same work (a single-run
backfill, so a thousand missing shards are a few runs, not a thousand), at most `max_runs`:
- a partition some asset of the dataset has not materialized (missing, or its last run failed) gets its
  missing assets and everything downstream of them re-materialized (generation resumes from its
  durable log, so finished replies are not paid for twice);
- a materialized partition where the latest evaluation of a check the registry repairs (`repair="checks"` in
  quality.registry: the ERROR gates and `decontamination`) failed gets every check of `{ds}_validated` re-run, and
  nothing downstream (useful after a threshold or benchmark change in the catalog; a real regression fails
  again and alerts again, a daily reminder that the shard needs attention).
A dataset that was never materialized is left alone: starting one is a decision, not a repair.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions
from eagle_data.defs.checks import validated_key
from eagle_data.defs.estimate import estimate_asset
from eagle_data.defs.instance import failed_check_partitions
from eagle_data.quality import registry

if TYPE_CHECKING:
    from eagle_data.defs.instance import BaseAssetGraph

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


def repaired_checks(graph: BaseAssetGraph, spec: DatasetSpec) -> tuple[list[dg.AssetCheckKey], list[dg.AssetCheckKey]]:
    """The checks of `{ds}_validated` the loaded definitions hold, in registry order: those whose failure asks
    for a repair (quality.registry's `repair`), and every one, which a repair re-runs so that the shard's
    whole Checks tab is current."""
    key, held = validated_key(spec), graph.asset_check_keys
    on_asset = [dg.AssetCheckKey(key, d.name) for d in registry.CHECKS if dg.AssetCheckKey(key, d.name) in held]
    return [k for k in on_asset if registry.check(k.name).repair == "checks"], on_asset


def _partitioned(graph: BaseAssetGraph, keys: Iterable[dg.AssetKey], spec: DatasetSpec) -> list[dg.AssetKey]:
    """The shard-partitioned assets among `keys`: a repair re-runs shards, never the dataset-wide estimate
    (partitioned too, only so that a group backfill is one run)."""
    estimate = dg.AssetKey(estimate_asset(spec))
    return [key for key in keys if graph.get(key).is_partitioned and key != estimate]


RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def consecutive_ranges(keys: Sequence[str], need: Mapping[str, Hashable]) -> list[tuple[str, str, Hashable]]:
    """Runs of consecutive partitions (in `keys` order) that need the same work: (first, last, work)."""
    ranges: list[tuple[str, str, Hashable]] = []
    previous = None
    for key in keys:
        work = need.get(key)
        if work is not None and previous is not None and ranges[-1][2] == work and previous == ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], key, work)
        elif work is not None:
            ranges.append((key, key, work))
        previous = key if work is not None else None
    return ranges


def repair_schedule(spec: DatasetSpec, max_runs: int) -> dg.ScheduleDefinition:
    ds = spec.name
    group = dg.AssetSelection.groups(ds)

    @dg.schedule(
        name=f"{ds}_nightly_repair",
        cron_schedule=NIGHTLY,
        target=group,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"{spec.title}: nightly re-run of missing/failed partitions and failed checks, in range runs "
        f"(max {max_runs}).",
    )
    def nightly(context: dg.ScheduleEvaluationContext):
        graph = context.repository_def.asset_graph
        keys = sorted(_partitioned(graph, group.resolve(graph), spec), key=lambda k: k.to_user_string())
        missing = _missing(context, keys, spec)
        if len(missing) == len(spec.partition_keys) and all(len(v) == len(keys) for v in missing.values()):
            return dg.SkipReason(f"{ds} was never materialized: start it by hand, this schedule only repairs")
        triggers, rerun = repaired_checks(graph, spec)
        failed_checks, validated = failed_check_partitions(context.instance, triggers), validated_key(spec)
        need: dict[str, Hashable] = {}
        for partition in spec.partition_keys:
            bad = missing.get(partition, [])
            if partition in failed_checks and validated not in bad:  # never export past a failed gate
                need[partition] = "checks"
            elif bad:
                need[partition] = frozenset(bad)
        night = context.scheduled_execution_time.strftime("%Y-%m-%d")
        selections: dict[Hashable, list[dg.AssetKey]] = {}  # one resolve per distinct set of missing assets
        requests = []
        for first, last, work in consecutive_ranges(spec.partition_keys, need)[:max_runs]:
            tags = {RANGE_START: first, RANGE_END: last}
            if work == "checks":
                requests.append(dg.RunRequest(run_key=f"{ds}-{first}...{last}-checks-{night}", tags=tags,
                                              asset_selection=[], asset_check_keys=rerun))  # fmt: skip
                continue
            if work not in selections:
                selection = (dg.AssetSelection.assets(*work).downstream() & group).resolve(graph)
                selections[work] = sorted(_partitioned(graph, selection, spec), key=lambda k: k.to_user_string())
            requests.append(dg.RunRequest(run_key=f"{ds}-{first}...{last}-assets-{night}", tags=tags,
                                          asset_selection=selections[work]))  # fmt: skip
        return requests or dg.SkipReason(f"{ds}: nothing to repair")

    return nightly


def build_schedules(specs: Sequence[DatasetSpec], max_runs: int = 20) -> list[dg.ScheduleDefinition]:
    """One stopped nightly repair schedule per dataset."""
    return [repair_schedule(spec, max_runs) for spec in specs]
