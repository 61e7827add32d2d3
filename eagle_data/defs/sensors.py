"""Alert sensors: open-source Dagster announces neither failed checks nor failed runs, so these do.

`quality_alerts` posts once per failed check and run, for every check the loaded definitions hold that the
check registry (`quality.registry`) marks alerted (the ERROR quality gates, the estimate's, `decontamination`, the
exports' `trainer_parity`, the capture's), listing every shard it failed on, once the check's step has ended
(cursor: the last check execution it handled, and the recent (run, check) pairs already announced). The grouping
is `alerts.group_failures`, over plain records. `run_failure_alerts` posts once per failed run of the instance,
launched from the UI, a sensor or the CLI (Dagster keeps its cursor), that has a failed step no failed blocking
check of its own explains: the registry makes every blocking check an alerted ERROR one, so a regression gives
exactly one message, and a run where a blocking check failed beside another step's error (an engine's, say, in a
range run over several datasets) still announces that error.
The webhook URL comes only from $EAGLE_DATA_ALERT_WEBHOOK; with it unset when the code location loads, both
sensors are stopped by default (an idle `dagster dev` stays quiet); unset later, they skip (and still move their
cursors, so setting it again does not replay history).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import dagster as dg

from eagle_data import alerts, settings
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.checks import blocked_steps
from eagle_data.defs.instance import failed_executions
from eagle_data.quality import registry

if TYPE_CHECKING:
    from eagle_data.defs.instance import AssetCheckExecutionRecord, SerializableErrorInfo

UI_URL_ENV = "EAGLE_DATA_UI_URL"
DEFAULT_UI_URL = "http://localhost:3000"
_HISTORY = 1000  # failed executions read per check and tick (one per shard); more than a tick can produce
# A failed check or run is announced at most this long after its step or run ended (so one message lists every
# failing shard), plus the tick's own time. Each tick is two INFO lines in the `dagster dev` terminal
# (dagster/_daemon/sensor.py): at 5 s the two alert sensors wrote most of an idle terminal's 160 lines in
# 5 minutes; a run takes hours, and half a minute to hear of its failure is soon enough.
ALERT_INTERVAL_S = 30
STEP_SUCCESS, STEP_FAILURE = dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE
_HANDLED = 200  # (run, asset, check) keys the cursor remembers, for shards evaluated after an alert went out


@dataclass(frozen=True)
class AlertCursor:
    """Where `quality_alerts` stands: every failed evaluation up to `after` (evaluation time, record id) is
    handled, and so are the (run, asset, check) groups in `handled` wherever their evaluations fall."""

    after: tuple[float, int]
    handled: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def load(cls, text: str) -> AlertCursor:
        state = json.loads(text)
        if isinstance(state, list):  # the cursor before alerts were grouped: (evaluation time, record id)
            return cls((state[0], state[1]))
        return cls(tuple(state["after"]), tuple(tuple(key) for key in state["handled"]))  # type: ignore[arg-type]

    def dump(self) -> str:
        return json.dumps({"after": self.after, "handled": self.handled})

    def handle(self, key: tuple[str, str, str]) -> AlertCursor:
        return replace(self, handled=(*self.handled, key)[-_HANDLED:])

    def moved_to(self, after: tuple[float, int]) -> AlertCursor:
        return replace(self, after=after)


def alert_key(alert: alerts.CheckAlert) -> tuple[str, str, str]:
    return (alert.run_id, alert.asset, alert.check)


def ready_failures(
    failed: Sequence[tuple[AssetCheckExecutionRecord, str]], instance: dg.DagsterInstance
) -> list[tuple[AssetCheckExecutionRecord, str]]:
    """The failures up to the first one whose step is still going: a check step yields all its evaluations
    (one per shard) before it ends, so one message can list every failing shard as soon as it has."""
    ended: dict[str, set[str]] = {}  # run id -> its ended steps
    ready = []
    for record, dataset in failed:
        run = instance.get_run_by_id(record.run_id)
        if run is not None and not run.is_finished:
            if record.run_id not in ended:
                events = instance.all_logs(record.run_id, of_type={STEP_SUCCESS, STEP_FAILURE})
                ended[record.run_id] = {e.step_key for e in events if e.step_key}
            if record.event.step_key not in ended[record.run_id]:
                break
        ready.append((record, dataset))
    return ready


def ui_url() -> str:
    return settings.get(UI_URL_ENV) or DEFAULT_UI_URL


def alert_status() -> dg.DefaultSensorStatus:
    """The alert sensors run by default only where $EAGLE_DATA_ALERT_WEBHOOK is set when the code location
    loads: with nowhere to post, each tick would only add two lines to the `dagster dev` terminal."""
    return dg.DefaultSensorStatus.RUNNING if alerts.webhook_url() else dg.DefaultSensorStatus.STOPPED


def alerted_checks(repository: dg.RepositoryDefinition, datasets: set[str]) -> dict[dg.AssetCheckKey, str]:
    """Every check the loaded definitions hold that alerts when it fails (quality.registry's `alert`; a check
    missing from the registry is announced too) -> the catalog dataset of its asset, else the asset's group
    (`exports`, `drafter`). Read from the definitions, not listed here, so no check is left out."""
    graph = repository.asset_graph
    return {
        key: _dataset_of([key.asset_key.path[-1]], datasets) or graph.get(key.asset_key).group_name
        for key in graph.asset_check_keys
        if (declared := registry.BY_NAME.get(key.name)) is None or declared.alert
    }


def _number(metadata: Mapping[str, dg.MetadataValue], name: str) -> float | None:
    value = metadata.get(name)
    return float(value.value) if value is not None and isinstance(value.value, int | float) else None


def _shards(record: AssetCheckExecutionRecord, metadata: Mapping[str, dg.MetadataValue]) -> tuple[str, ...]:
    """The shards one evaluation found failing: its own partition, or a range result's `failing_shards`
    (else the range it judged)."""
    if record.partition:
        return (record.partition,)
    for name in ("failing_shards", "partitions"):
        if (value := metadata.get(name)) is not None and value.value:
            return tuple(str(value.value).split(","))
    return ()


def check_failure(record: AssetCheckExecutionRecord, dataset: str) -> alerts.CheckFailure:
    """A failed check execution record as the plain values alerts are made of."""
    evaluation = record.event.dagster_event.event_specific_data
    metadata = dict(evaluation.metadata)
    return alerts.CheckFailure(
        run_id=record.run_id,
        dataset=dataset,
        asset=record.key.asset_key.to_user_string(),
        check=evaluation.check_name,
        severity=evaluation.severity.value,
        shards=_shards(record, metadata),
        message=evaluation.description or "",
        figure=_number(metadata, "figure"),
        threshold=_number(metadata, "threshold"),
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


def failed_asset(selected: Sequence[str], assets: Collection[str], failed_steps: Sequence[str]) -> str | None:
    """The asset a failed run is about: the first failed step that is an asset (an asset's step is named
    after it), else the run's only selected asset."""
    named = next((step for step in failed_steps if step in (selected or assets)), None)
    return named or (selected[0] if len(selected) == 1 else None)


def _partition_of(run: dg.DagsterRun) -> str | None:
    tags = run.tags
    if "dagster/partition" in tags:
        return tags["dagster/partition"]
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    return f"{start}...{end}" if start and end else None


def _failed_checks(
    context: dg.SensorEvaluationContext, datasets: set[str]
) -> list[tuple[AssetCheckExecutionRecord, str]]:
    """Every failed execution of an alerted check, with its dataset, in the order the failures became known
    (evaluation time, not record id: an id is given when the check is planned, so a run that planned early
    but failed late would fall behind the cursor)."""
    failed = [
        (record, dataset)
        for key, dataset in alerted_checks(context.repository_def, datasets).items()
        for record in failed_executions(context.instance, key, _HISTORY)
        if isinstance(record.evaluation, dg.AssetCheckEvaluation)
    ]
    return sorted(failed, key=lambda pair: _evaluated(pair[0]))


def _post_check_alerts(context: dg.SensorEvaluationContext, datasets: set[str]) -> dg.SkipReason:
    failed = _failed_checks(context, datasets)
    if context.cursor is None:  # first tick: start from now, do not replay history
        context.update_cursor(AlertCursor(_evaluated(failed[-1][0]) if failed else (0.0, 0)).dump())
        return dg.SkipReason("started; alerting on check failures from now on")
    cursor, url, sent = AlertCursor.load(context.cursor), alerts.webhook_url(), 0
    ready = ready_failures([pair for pair in failed if _evaluated(pair[0]) > cursor.after], context.instance)
    for alert in alerts.group_failures(check_failure(record, dataset) for record, dataset in ready):
        if (key := alert_key(alert)) in cursor.handled:
            continue  # a late shard of a (run, check) already announced
        if url:
            try:
                alerts.post_alert(alerts.check_alert(alert, ui_url()), url)
            except alerts.AlertError as exc:  # the cursor keeps what was sent: the rest is retried next tick
                return dg.SkipReason(f"{exc}; posted {sent}, retrying the rest next tick")
            sent += 1
        cursor = cursor.handle(key)
        context.update_cursor(cursor.dump())
    if ready:
        context.update_cursor(cursor.moved_to(_evaluated(ready[-1][0])).dump())
    return dg.SkipReason(f"posted {sent} alert(s)" if url else f"alerts off: ${alerts.WEBHOOK_ENV} is not set")


def quality_alerts_sensor(datasets: set[str], status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    @dg.sensor(
        name="quality_alerts",
        minimum_interval_seconds=ALERT_INTERVAL_S,
        default_status=status,
        description=f"Posts one message per failed alerted check (every check the definitions hold that the check "
        f"registry alerts on) and run, listing the failing shards, to ${alerts.WEBHOOK_ENV} (Slack format).",
    )
    def quality_alerts(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        return _post_check_alerts(context, datasets)

    return quality_alerts


def unannounced_failures(
    steps: Sequence[dg.DagsterEvent], blocked: Mapping[str, Sequence[str]]
) -> list[dg.DagsterEvent]:
    """The failed steps no check alert speaks for: a step that failed on its own failed blocking check (the
    gates' step, the estimate's on `canary` or `within_budget`) is announced by `quality_alerts` (every
    blocking check alerts: quality.registry); any other is not, a later generation run refusing after an
    earlier run's failed canary among them."""
    return [step for step in steps if (step.step_key or "") not in blocked]


def _post_run_alert(context: dg.RunFailureSensorContext, datasets: set[str]) -> dg.SkipReason:
    run = context.dagster_run
    blocked = blocked_steps(context.instance, run.run_id)
    steps = unannounced_failures(context.get_step_failure_events(), blocked)
    if blocked and not steps:
        covered = ", ".join(name for names in blocked.values() for name in names)
        return dg.SkipReason(f"run {run.run_id} failed on check(s) {covered}: already announced")
    error = _root_error(steps[0].event_specific_data.error) if steps else context.failure_event.message
    selected = [key.to_user_string() for key in run.asset_selection or ()]
    assets = {key.to_user_string() for key in context.repository_def.asset_graph.get_all_asset_keys()}
    asset = failed_asset(selected, assets, [s.step_key or "" for s in steps])
    names = [asset or ""] + [k.path[-1] for k in run.asset_selection or ()] + [s.step_key or "" for s in steps]
    alerts.post_alert(  # a refused post fails this tick (visible in the UI); Dagster moves on to the next run
        alerts.run_alert(
            job=run.job_name,
            run_id=run.run_id,
            base_url=ui_url(),
            error=error or "",
            dataset=_dataset_of(names, datasets),
            asset=asset,
            partition=_partition_of(run),
        ),
        alerts.webhook_url(),
    )
    return dg.SkipReason(f"posted an alert for run {run.run_id}")


def run_failure_sensor(datasets: set[str], status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    @dg.run_failure_sensor(
        name="run_failure_alerts",
        minimum_interval_seconds=ALERT_INTERVAL_S,
        default_status=status,
        # Every run of the instance: a run started by `dagster asset materialize` or `dg launch` carries no
        # code-location origin (`remote_job_origin` is None), and without this Dagster matches only runs whose
        # origin is this sensor's location (dagster/_core/definitions/run_status_sensor_definition.py, the
        # `monitor_all_code_locations` branch), so a failed CLI run was never announced.
        monitor_all_code_locations=True,
        description=f"Posts each failed run to ${alerts.WEBHOOK_ENV}, unless failed blocking checks (already "
        "announced) stopped every step that failed.",
    )
    def run_failure_alerts(context: dg.RunFailureSensorContext) -> dg.SkipReason:
        if not alerts.webhook_url():
            return dg.SkipReason(f"alerts off: ${alerts.WEBHOOK_ENV} is not set")
        return _post_run_alert(context, datasets)

    return run_failure_alerts


def build_sensors(specs: Sequence[DatasetSpec]) -> list[dg.SensorDefinition]:
    datasets, status = {s.name for s in specs}, alert_status()
    return [quality_alerts_sensor(datasets, status), run_failure_sensor(datasets, status)]
