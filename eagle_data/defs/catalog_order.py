"""Catalog order: one dataset at a time, each as an ordinary run of its assets. Off by default.

Turn it on in the UI (Automation) or with `dagster sensor start catalog_order`. Each tick it looks at the
run it started last (tag `eagle_data/catalog_order`; a re-execution of that run counts as the same step):
- still queued or running: wait;
- succeeded, or failed only on a blocking check (the pre-flight `within_budget` or `canary`, or a quality
  gate: that dataset is as done as it will get without a person): start the next dataset in catalog order;
- failed on `failed_rate` (too many requests failed: an engine down, a key out of credit) or otherwise (a
  bug): stop, say so, and wait for that run to be re-executed (failed rows are requested again).
A dataset's run covers all its partitions in one run (single-run backfill policy) and selects
`{ds}_prompts`, `{ds}_estimate` (blocking `within_budget` and `canary`: every dataset is canaried before its
generation, which depends on it), `{ds}` (in its engine's pool) and
`{ds}_validated` with its checks, so pools, blocking checks, alerts and run monitoring all apply.
The cursor holds the dataset being walked; `dagster sensor cursor catalog_order --delete` starts over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import dagster as dg

from eagle_data.catalog import DatasetSpec
from eagle_data.defs.checks import failed_blocking_checks
from eagle_data.quality.gates import FAILED_RATE

ORDER_TAG = "eagle_data/catalog_order"  # the dataset a run walks
ROUND_TAG = "eagle_data/catalog_round"  # which walk of the catalog (a fresh cursor starts a new one)
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def dataset_job(spec: DatasetSpec) -> dg.UnresolvedAssetJobDefinition:
    """One dataset's assets and their checks. A job per dataset, because datasets may have different
    partitions (one job over several would not load)."""
    return dg.define_asset_job(
        f"{spec.name}_run",
        selection=dg.AssetSelection.groups(spec.name),
        description=f"{spec.title}: prompts, estimate (blocking budget and canary checks), generation, validation.",
    )


def dataset_run(spec: DatasetSpec, round_id: str) -> dg.RunRequest:
    """Every partition of one dataset's assets (and their checks) in one run."""
    keys = spec.partition_keys
    return dg.RunRequest(
        run_key=f"{round_id}-{spec.name}",
        job_name=f"{spec.name}_run",
        tags={ORDER_TAG: spec.name, ROUND_TAG: round_id, RANGE_START: keys[0], RANGE_END: keys[-1]},
    )


def waits_on(dataset: str, run: dg.DagsterRun, failed_checks: Sequence[str]) -> str | None:
    """Why the walk stays on this dataset's run (None: the run has ended and the next dataset starts).
    `failed_checks` are the blocking checks that failed in the run."""
    if not run.is_finished:
        return f"{dataset}: run {run.run_id} is {run.status.value}; the next dataset waits"
    if run.status == dg.DagsterRunStatus.SUCCESS:
        return None
    if not failed_checks:
        return f"{dataset}: run {run.run_id} {run.status.value}; re-execute it to go on"
    if FAILED_RATE in failed_checks:  # not as done as it gets: a re-execution requests the failed rows again
        return f"{dataset}: run {run.run_id} failed on {FAILED_RATE} (too many requests failed); re-execute it to go on"
    return None


def latest_run(instance: dg.DagsterInstance, dataset: str, round_id: str) -> dg.DagsterRun | None:
    """The newest run of `dataset` in this round (a re-execution carries the same tags)."""
    records = instance.get_run_records(dg.RunsFilter(tags={ORDER_TAG: dataset, ROUND_TAG: round_id}), limit=1)
    return records[0].dagster_run if records else None


def catalog_order_sensor(specs: Sequence[DatasetSpec]) -> dg.SensorDefinition:
    order = [spec.name for spec in specs]
    by_name = {spec.name: spec for spec in specs}

    @dg.sensor(
        name="catalog_order",
        jobs=[dataset_job(spec) for spec in specs],
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Materializes every dataset in catalog order ({', '.join(order)}), the next when the previous "
        "run ends (done or at budget).",
    )
    def catalog_order(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        state = json.loads(context.cursor) if context.cursor else {"round": f"{time.time():.0f}", "index": -1}
        round_id, index = state["round"], state["index"]
        if index >= 0:
            dataset = order[index]
            run = latest_run(context.instance, dataset, round_id)
            if run is None:
                return dg.SkipReason(f"waiting for the run of {dataset} to be created")
            failed = failed_blocking_checks(context.instance, run.run_id) if run.is_failure_or_canceled else []
            if why := waits_on(dataset, run, failed):
                return dg.SkipReason(why)
        if index + 1 >= len(order):
            return dg.SkipReason(f"every dataset of the catalog has had its run ({len(order)})")
        spec = by_name[order[index + 1]]
        context.log.info(f"catalog order: starting {spec.name} ({index + 2} of {len(order)})")
        return dg.SensorResult(
            run_requests=[dataset_run(spec, round_id)], cursor=json.dumps({"round": round_id, "index": index + 1})
        )

    return catalog_order
