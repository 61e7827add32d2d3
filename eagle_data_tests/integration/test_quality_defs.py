"""The Dagster layer of the quality gates, end to end on a real Dagster instance and a 127.0.0.1 receiver.

Stand-in `{ds}_validated` and export assets write the fixture frames through the real storage resource;
the checks, sensors and schedule under test are the ones definitions.py wires for every dataset.
"""

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from eagle_data import layout, quality
from eagle_data.alerts import WEBHOOK_ENV
from eagle_data.catalog import Adapter, DatasetSpec, catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.checks import build_checks, check_keys
from eagle_data.defs.drafter import build_decontamination_checks
from eagle_data.defs.exports import build_exports
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.defs.schedules import build_schedules, consecutive_ranges
from eagle_data.defs.sensors import UI_URL_ENV, build_sensors
from eagle_data.report import inputs_for, write_shard_report
from eagle_data.stages.validation import earlier_avg_completion_tokens
from eagle_data.standins.webhook import Receiver
from eagle_data.storage import ShardStore
from eagle_data.targets.rows import MESSAGE_DTYPE
from eagle_data_tests.fixtures_quality import clean_frame, generation_frame, regression_frame

SPEC = DatasetSpec(
    name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"), max_prompts=40,
    shard_size=10,
)  # fmt: skip
VALIDATED, EXPORT = dg.AssetKey("b9_fixture_validated"), dg.AssetKey("b9_fixture_export")
FRAMES = {"00000": clean_frame(), "00001": regression_frame(dataset="r")}
BROKEN = "00002"  # its generation shard is "missing": the validated asset raises
UI = "http://dagster.test:3000"


def stand_in_assets(spec: DatasetSpec) -> list[dg.AssetsDefinition]:
    parts = dg.StaticPartitionsDefinition(spec.partition_keys)

    @dg.asset(name=VALIDATED.path[-1], group_name=spec.name, partitions_def=parts)
    def validated(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
        """What the real asset does per shard, on fixture frames instead of generated ones."""
        frames = []
        for key in context.partition_keys:
            if key not in FRAMES:
                raise RuntimeError(f"generation shard {key} missing: materialize {spec.name} first\nTraceback ...")
            frames.append(quality.row_verdicts(FRAMES[key], spec.checks, spec.generation.thinking))
            storage.store().write_shard(spec.name, VALIDATED.path[-1], key, frames[-1])
            previous = earlier_avg_completion_tokens(spec, storage.store(), key)
            write_shard_report(spec, storage.store(), quality.shard_record(key, frames[-1], inputs_for(spec, previous)))
        return dg.MaterializeResult(metadata=quality.figures(pl.concat(frames), spec.checks).numbers)

    @dg.asset(name=EXPORT.path[-1], group_name=spec.name, partitions_def=parts, deps=[validated])
    def export() -> None:
        pass

    return [validated, export]


HEADLINE = "ERROR check empty_response failed on b9_fixture (b9_fixture_validated) [00001]"
FROM_START = "[0, 0]"  # a quality_alerts cursor before every evaluation: (evaluated at, record id)


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, name: str, cursor: str | None) -> Any:
    """One evaluation of a sensor, as the daemon would run it."""
    context = dg.build_sensor_context(instance=instance, repository_def=defs.get_repository_def(), cursor=cursor)
    return defs.resolve_sensor_def(name).evaluate_tick(context)


@dataclass
class Scenario:
    instance: dg.DagsterInstance
    defs: dg.Definitions
    runs: dict[str, dg.ExecuteInProcessResult]
    alerts: list[dict[str, Any]]
    skips: list[str]  # skip messages of the sensor ticks after each run, then of a final round
    check_cursor: str

    def tick(self, name: str, cursor: str | None) -> Any:  # SensorExecutionData
        return tick(self.defs, self.instance, name, cursor)

    @property
    def repo(self) -> dg.RepositoryDefinition:
        return self.defs.get_repository_def()


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    """Runs partitions 00000 (clean), 00001 (the 87% regression) and 00002 (fails), ticking both sensors."""
    root: Path = tmp_path_factory.mktemp("store")
    defs = dg.Definitions(
        assets=stand_in_assets(SPEC),
        asset_checks=build_checks([SPEC]),
        sensors=build_sensors([SPEC]),
        schedules=build_schedules([SPEC]),
        resources={**shard_resources(StorageResource(root=str(root)))},
    )
    with dg.instance_for_test() as instance, Receiver() as receiver, pytest.MonkeyPatch.context() as env:
        env.setenv(WEBHOOK_ENV, receiver.url)
        env.setenv(UI_URL_ENV, UI)
        s = Scenario(instance, defs, {}, receiver.bodies, [], "")
        cursors = {"quality_alerts": s.tick("quality_alerts", None).cursor, "run_failure_alerts": None}
        job = defs.resolve_implicit_global_asset_job_def()
        for key in ("00000", "00001", BROKEN, "final"):
            if key != "final":
                s.runs[key] = job.execute_in_process(partition_key=key, instance=instance, raise_on_error=False)
            for name in cursors:
                tick = s.tick(name, cursors[name])
                cursors[name] = tick.cursor
                s.skips.append(f"{name}: {tick.skip_message}")
        s.check_cursor = cursors["quality_alerts"] or ""
        yield s


def test_build_checks_declares_every_gate_of_every_catalog_dataset() -> None:
    specs = list(catalog().values())
    checks = build_checks(specs)
    assert len(checks) == len(specs)
    declared = {(s.asset_key.path[-1], s.name): s.blocking for c in checks for s in c.check_specs}
    assert len(declared) == len(specs) * len(quality.CHECKS)
    assert declared[("b7_sharegpt_validated", "empty_response")] is True
    assert declared[("b7_sharegpt_validated", "truncation_rate")] is False
    assert declared[("b7_sharegpt_validated", "failed_rate")] is True
    assert check_keys(SPEC)[0] == dg.AssetCheckKey(VALIDATED, "empty_response")


def test_clean_partition_passes_and_is_exported(scenario: Scenario) -> None:
    result = scenario.runs["00000"]
    assert result.success
    assert all(e.passed for e in result.get_asset_check_evaluations())
    assert "00000" in scenario.instance.get_materialized_partitions(EXPORT)


def test_regression_fails_the_blocking_check_and_the_exports_do_not_run(scenario: Scenario) -> None:
    result = scenario.runs["00001"]
    assert not result.success
    failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
    assert [(e.check_name, e.severity, e.blocking) for e in failed] == [  # length_shift: 00001 never ran before
        ("empty_response", dg.AssetCheckSeverity.ERROR, True),
    ]
    assert scenario.instance.get_materialized_partitions(EXPORT) == {"00000"}


def test_the_receiver_gets_exactly_one_alert_for_the_regression(scenario: Scenario) -> None:
    regression = [a for a in scenario.alerts if "empty_response" in a["text"]]
    assert len(regression) == 1
    alert = regression[0]
    assert alert["blocks"][0]["text"]["text"] == HEADLINE
    assert "87.0% of 200 replies were empty or had loss-mask sum" in alert["text"]
    assert f"{UI}/runs/{scenario.runs['00001'].run_id}" in alert["text"]
    assert f"{UI}/assets/b9_fixture_validated?view=checks&checkDetail=empty_response" in alert["text"]
    assert "0.87 vs 0.01" in json.dumps(alert)
    assert any("failed on check(s) empty_response: already announced" in s for s in scenario.skips)


def test_a_failed_run_alerts_once_with_its_cause(scenario: Scenario) -> None:
    failures = [a for a in scenario.alerts if a["text"].startswith("Run failed")]
    assert len(failures) == 1
    assert failures[0]["blocks"][0]["text"]["text"] == "Run failed: b9_fixture (b9_fixture_validated) [00002]"
    assert (
        failures[0]["blocks"][1]["text"]["text"]
        == "RuntimeError: generation shard 00002 missing: materialize b9_fixture first"
    )
    assert f"{UI}/assets/b9_fixture_validated" in failures[0]["text"]
    assert len(scenario.alerts) == 2  # the final round of ticks posted nothing again


def test_without_a_webhook_the_sensor_skips_but_moves_its_cursor(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)
    tick = scenario.tick("quality_alerts", FROM_START)
    assert tick.skip_message == f"alerts off: ${WEBHOOK_ENV} is not set"
    assert tick.cursor == scenario.check_cursor != FROM_START


def test_a_refused_alert_is_retried_on_the_next_tick(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    with Receiver(status=500) as refusing:
        monkeypatch.setenv(WEBHOOK_ENV, refusing.url)
        tick = scenario.tick("quality_alerts", FROM_START)
    assert "HTTP 500" in (tick.skip_message or "") and tick.cursor in (None, FROM_START)
    with Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        tick = scenario.tick("quality_alerts", FROM_START)
    assert [a["blocks"][0]["text"]["text"] for a in receiver.bodies] == [HEADLINE]
    assert tick.cursor == scenario.check_cursor


def test_nightly_repair_is_off_by_default_and_asks_for_the_right_runs(scenario: Scenario) -> None:
    schedule = scenario.defs.resolve_schedule_def("b9_fixture_nightly_repair")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    context = dg.build_schedule_context(
        instance=scenario.instance, scheduled_execution_time=dt.datetime(2026, 12, 1, 3), repository_def=scenario.repo
    )
    requests = {
        (r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"]): r
        for r in schedule.evaluate_tick(context).run_requests or []
    }  # range runs: consecutive partitions that need the same work share one run
    assert set(requests) == {("00001", "00001"), (BROKEN, "00003")}  # 00000 is complete; 00002 and 00003 alike
    checks = requests[("00001", "00001")]
    assert checks.asset_selection == [] and checks.asset_check_keys == check_keys(SPEC)
    assert requests[(BROKEN, "00003")].asset_selection == [EXPORT, VALIDATED]
    assert requests[(BROKEN, "00003")].run_key == "b9_fixture-00002...00003-assets-2026-12-01"


def test_nightly_repair_asks_for_range_runs_of_partitions_that_need_the_same_work() -> None:
    keys = [f"{i:05d}" for i in range(8)]
    need = {"00000": "checks", "00001": "checks", "00003": "a", "00004": "a", "00005": "b", "00006": "a"}
    assert consecutive_ranges(keys, need) == [
        ("00000", "00001", "checks"), ("00003", "00004", "a"), ("00005", "00005", "b"), ("00006", "00006", "a")
    ]  # fmt: skip


def test_nightly_repair_leaves_a_dataset_never_started_alone(scenario: Scenario) -> None:
    with dg.instance_for_test() as fresh:
        context = dg.build_schedule_context(
            instance=fresh, scheduled_execution_time=dt.datetime(2026, 12, 1, 3), repository_def=scenario.repo
        )
        result = scenario.defs.resolve_schedule_def("b9_fixture_nightly_repair").evaluate_tick(context)
    assert not result.run_requests
    assert "never materialized" in (result.skip_message or "")


def test_check_results_carry_figure_threshold_and_partition(scenario: Scenario) -> None:
    evaluation = next(
        e for e in scenario.runs["00001"].get_asset_check_evaluations() if e.check_name == "empty_response"
    )
    metadata = {k: v.value for k, v in evaluation.metadata.items()}
    assert metadata["figure"] == pytest.approx(0.87) and metadata["threshold"] == 0.01
    assert evaluation.partition == "00001" and len(metadata["shard_sha256"]) == 64
    assert evaluation.description and "87.0%" in evaluation.description


def test_a_range_run_is_judged_shard_by_shard(scenario: Scenario) -> None:
    tags = {"dagster/asset_partition_range_start": "00000", "dagster/asset_partition_range_end": "00001"}
    with dg.instance_for_test() as instance:
        job = scenario.defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)
    assert not result.success
    evaluations = [e for e in result.get_asset_check_evaluations() if e.check_name == "empty_response"]
    assert [(e.partition, e.passed) for e in evaluations] == [("00000", True), ("00001", False)]
    assert evaluations[1].description and evaluations[1].description.startswith("87.0% of 200 replies were empty")


def test_through_the_real_validation_stage_the_regression_stops_the_training_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acceptance test on the real `{ds}_validated` and `training_mix` assets: token ids and loss
    masks come from the targets room, the gate blocks the export, the receiver gets one alert."""
    spec = DatasetSpec(
        name="b9_real", title="Real", adapter=Adapter(prompt_field="q", response_field="r"), max_prompts=400,
        shard_size=200, target="qwen3-test",
    )  # fmt: skip
    ShardStore(str(tmp_path)).write_shard(spec.name, spec.name, "00000", generation_frame(200, dataset=spec.name))
    defs = dg.Definitions(
        assets=[*build_dataset_assets(spec), build_exports([spec], build_checks([spec]))],
        asset_checks=build_checks([spec]),
        sensors=build_sensors([spec]),
        resources={**shard_resources(StorageResource(root=str(tmp_path))), "engine": EngineResource()},
    )
    selection = {dg.AssetKey("b9_real_validated"), dg.AssetKey("training_mix")}
    with dg.instance_for_test() as instance, Receiver() as receiver:
        job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=selection)
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        cursors = {name: tick(defs, instance, name, None).cursor for name in ("quality_alerts", "run_failure_alerts")}
        result = job.execute_in_process(partition_key="00000", instance=instance, raise_on_error=False)
        for name, cursor in cursors.items():
            tick(defs, instance, name, cursor)
        assert instance.get_latest_materialization_event(dg.AssetKey("training_mix")) is None
    assert not result.success
    assert len(receiver.bodies) == 1
    assert "empty_response failed on b9_real (b9_real_validated) [00000]" in receiver.bodies[0]["text"]
    assert "87.0% of 200 replies were empty or had loss-mask sum" in receiver.bodies[0]["text"]


def test_a_failed_decontamination_check_is_announced_once_as_a_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocking check outside the quality gates (here decontamination) that stops a run is announced by
    `quality_alerts` with its figures, and `run_failure_alerts` leaves that run alone: one message. It used
    to reach the receiver only as a generic "Run failed"."""
    spec = SPEC.model_copy(update={"name": "b9_leak"})
    benchmark_item = "def has_close_elements(numbers: List[float], threshold: float) -> bool: Check if in given list"
    shard = pl.DataFrame(
        {"prompt_id": ["p0"], "verdict": ["pass"],
         "messages": pl.Series([[{"role": "user", "content": benchmark_item}, {"role": "assistant", "content": "ok"}]],
                               dtype=pl.List(MESSAGE_DTYPE))}
    )  # fmt: skip

    @dg.asset(name="b9_leak_validated", partitions_def=dg.StaticPartitionsDefinition(spec.partition_keys))
    def validated(context, storage: StorageResource) -> None:  # context unannotated: string annotations here
        storage.store().write_frame(layout.shard(spec.name, context.asset_key.path[-1], context.partition_key), shard)

    defs = dg.Definitions(
        assets=[validated],
        asset_checks=build_decontamination_checks([spec]),
        sensors=build_sensors([spec]),
        resources={**shard_resources(StorageResource(root=str(tmp_path)))},
    )
    with dg.instance_for_test() as instance, Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        cursors = {name: tick(defs, instance, name, None).cursor for name in ("quality_alerts", "run_failure_alerts")}
        job = defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(partition_key="00000", instance=instance, raise_on_error=False)
        skips = [tick(defs, instance, name, cursor).skip_message for name, cursor in cursors.items()]
    assert not result.success
    assert [a["blocks"][0]["text"]["text"] for a in receiver.bodies] == [
        "ERROR check decontamination failed on b9_leak (b9_leak_validated) [00000]"
    ]
    assert "1 row(s) kept for training overlap a benchmark" in receiver.bodies[0]["text"]
    assert "failed on check(s) decontamination: already announced" in (skips[1] or "")


