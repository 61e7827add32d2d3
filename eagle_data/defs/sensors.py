"""Alert sensors: open-source Dagster announces neither failed checks nor failed runs, so these do.

`quality_alerts` posts once per run and failed ERROR check of any catalog dataset, naming every shard it
failed on (checks are evaluated per shard): the ERROR quality gates, the pre-flight `within_budget` and
`canary`, and `decontamination` (cursor: the last check execution it handled). `run_failure_alerts` posts once per
failed run (Dagster keeps its cursor), except runs a failed blocking check stopped: every blocking check
is an ERROR one `quality_alerts` announces, so a regression gives exactly one message. The webhook URL
comes only from $EAGLE_DATA_ALERT_WEBHOOK; with it unset both sensors skip (and still move their cursors,
so setting it later does not replay history).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from eagle_data import alerts, quality, settings
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import CANARY, WITHIN_BUDGET, estimate_asset
from eagle_data.defs.checks import failed_blocking_checks, validated_key
from eagle_data.defs.drafter import DECONTAMINATION
from eagle_data.defs.instance import failed_executions

if TYPE_CHECKING:
    from eagle_data.defs.instance import AssetCheckExecutionRecord, SerializableErrorInfo

UI_URL_ENV = "EAGLE_DATA_UI_URL"
DEFAULT_UI_URL = "http://localhost:3000"
_HISTORY = 1000  # failed executions read per check and tick (one per shard); more than a tick can produce
_SHARDS_NAMED = 20  # failing shards an alert lists by name


def ui_url() -> str:
    return settings.get(UI_URL_ENV) or DEFAULT_UI_URL


def _error_checks(specs: Sequence[DatasetSpec]) -> dict[dg.AssetCheckKey, str]:
    """ERROR-severity check keys -> dataset name: the ERROR quality gates, and the blocking checks that
    live elsewhere (the estimate's `within_budget` and `canary`, `decontamination`), which are always ERROR."""
    keys = {}
    for s in specs:
        names = [d.name for d in quality.CHECKS if d.severity == "ERROR"] + [DECONTAMINATION]
        keys |= {dg.AssetCheckKey(validated_key(s), name): s.name for name in names}
        keys |= {dg.AssetCheckKey(dg.AssetKey(estimate_asset(s)), name): s.name for name in (WITHIN_BUDGET, CANARY)}
    return keys


def _number(metadata: Mapping[str, dg.MetadataValue], name: str) -> float | None:
    value = metadata.get(name)
    return float(value.value) if value is not None and isinstance(value.value, int | float) else None


def _shards(partitions: Sequence[str]) -> str | None:
    """The failing shards an alert names: all of a few, the first ones of many."""
    if not partitions:
        return None
    more = f" and {len(partitions) - _SHARDS_NAMED} more" if len(partitions) > _SHARDS_NAMED else ""
    return ", ".join(partitions[:_SHARDS_NAMED]) + more


def _check_payload(records: Sequence[AssetCheckExecutionRecord], dataset: str) -> alerts.Payload:
    """One alert for one check's failures in one run: every failing shard named, the first one's figures."""
    evaluation = records[0].event.dagster_event.event_specific_data
    metadata = dict(evaluation.metadata)
    partitions = [r.partition for r in records if r.partition]
    said = evaluation.description or ""
    if len(partitions) > 1:
        said = f"{len(partitions)} shards fail; shard {partitions[0]}: {said}"
    return alerts.check_alert(
        dataset=dataset,
        partition=_shards(partitions),
        check=evaluation.check_name,
        severity=evaluation.severity.value,
        figure=_number(metadata, "figure"),
        threshold=_number(metadata, "threshold"),
        message=said,
        run_id=records[0].run_id,
        base_url=ui_url(),
    )


def _evaluated(record: AssetCheckExecutionRecord) -> tuple[float, int]:
    """(evaluation time, record id): the order in which failures became known."""
    return (record.event.timestamp, record.id)


def _root_error(error: SerializableErrorInfo | None) -> str:
    """The innermost cause of a step error: the user's exception, not Dagster's wrapper around it."""
    while error is not None and error.cause is not None:
        error = error.cause
    return error.message if error is not None else ""


def _dataset_of(names: Sequence[str], datasets: set[str]) -> str | None:
    """The catalog dataset of the first asset or step name that is `{ds}` or `{ds}_...`."""
    return next((d for d in sorted(datasets) if any(n == d or n.startswith(f"{d}_") for n in names)), None)


def _partition_of(run: dg.DagsterRun) -> str | None:
    tags = run.tags
    if "dagster/partition" in tags:
        return tags["dagster/partition"]
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    return f"{start}...{end}" if start and end else None


def build_sensors(specs: Sequence[DatasetSpec]) -> list[dg.SensorDefinition]:
    checks = _error_checks(specs)
    datasets = {s.name for s in specs}

    @dg.sensor(
        name="quality_alerts",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Posts each failed ERROR check (quality gates, within_budget, canary, decontamination) to "
        f"${alerts.WEBHOOK_ENV} (Slack format).",
    )
    def quality_alerts(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        failed = [record for key in checks for record in failed_executions(context.instance, key, _HISTORY)]
        # Ordered by when the check was evaluated, not by record id: a record's id is given when the check
        # is planned, so a run that planned early but failed late would fall behind the cursor.
        failed.sort(key=_evaluated)
        if context.cursor is None:  # first tick: start from now, do not replay history
            context.update_cursor(json.dumps(_evaluated(failed[-1]) if failed else (0.0, 0)))
            return dg.SkipReason("started; alerting on check failures from now on")
        cursor, url, sent = tuple(json.loads(context.cursor)), alerts.webhook_url(), 0
        groups: dict[tuple[str, dg.AssetCheckKey], list[AssetCheckExecutionRecord]] = {}  # run, check -> records
        for record in failed:
            if _evaluated(record) > cursor:
                groups.setdefault((record.run_id, record.key), []).append(record)
        order = list(groups.values())  # by each group's first failure
        for i, group in enumerate(order):
            if url:
                try:
                    alerts.post_alert(_check_payload(group, checks[group[0].key]), url)
                except alerts.AlertError as exc:  # the cursor stays before every group not sent: retried next tick
                    return dg.SkipReason(f"{exc}; posted {sent}, retrying the rest next tick")
                sent += 1
            horizon = _evaluated(order[i + 1][0]) if i + 1 < len(order) else None
            sent_before = [
                _evaluated(r) for g in order[: i + 1] for r in g if horizon is None or _evaluated(r) < horizon
            ]
            context.update_cursor(json.dumps(max(sent_before)))
        return dg.SkipReason(f"posted {sent} alert(s)" if url else f"alerts off: ${alerts.WEBHOOK_ENV} is not set")

    @dg.run_failure_sensor(
        name="run_failure_alerts",
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Posts each failed run to ${alerts.WEBHOOK_ENV}, unless a failed blocking check (already "
        "announced) stopped it.",
    )
    def run_failure_alerts(context: dg.RunFailureSensorContext) -> dg.SkipReason:
        run = context.dagster_run
        url = alerts.webhook_url()
        if not url:
            return dg.SkipReason(f"alerts off: ${alerts.WEBHOOK_ENV} is not set")
        if covered := failed_blocking_checks(context.instance, run.run_id):
            return dg.SkipReason(f"run {run.run_id} failed on check(s) {', '.join(covered)}: already announced")
        steps = context.get_step_failure_events()
        error = _root_error(steps[0].event_specific_data.error) if steps else context.failure_event.message
        names = [k.path[-1] for k in run.asset_selection or ()] + [s.step_key or "" for s in steps]
        alerts.post_alert(  # a refused post fails this tick (visible in the UI); Dagster moves on to the next run
            alerts.run_alert(
                job=run.job_name,
                run_id=run.run_id,
                base_url=ui_url(),
                error=error or "",
                dataset=_dataset_of(names, datasets),
                partition=_partition_of(run),
            ),
            url,
        )
        return dg.SkipReason(f"posted an alert for run {run.run_id}")

    return [quality_alerts, run_failure_alerts]
