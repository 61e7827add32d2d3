"""Every check the definitions hold is declared once, in the check registry, and is announced when it fails as
the registry says: the alert sensor reads the checks from the loaded definitions and their alert behaviour from
the registry, so the capture's five checks, `trainer_parity` and `decontamination` post as the quality gates do.
A run a blocking check stopped is announced by that check's alert, and any other error of the same run by the
run-failure alert (it used to be skipped with the whole run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from eagle_data import layout
from eagle_data.alerts import WEBHOOK_ENV
from eagle_data.catalog import load_catalog
from eagle_data.definitions import build_definitions
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.checks import build_checks
from eagle_data.defs.drafter import follow_the_mix
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import ENGINE_ENV, POOL_ENV, EngineResource, StorageResource
from eagle_data.defs.schedules import repaired_checks
from eagle_data.defs.sensors import build_sensors
from eagle_data.quality import registry
from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data.standins.webhook import Receiver
from eagle_data_tests.e2e.test_capture_checks import KEY, RANGE, capture_asset  # noqa: F401 (a fixture)
from eagle_data_tests.fixtures_stages import standin_demo
from eagle_data_tests.integration.test_quality_defs import EXPORT, FROM_START, SPEC, stand_in_assets, tick

SENSORS = ("quality_alerts", "run_failure_alerts")


@pytest.fixture(scope="module")
def demo() -> dg.Definitions:
    return build_definitions(list(load_catalog(profile="demo").values()))


def _asset_pattern(asset: str, datasets: set[str]) -> str:
    ds = next((d for d in datasets if asset.startswith(f"{d}_")), None)
    return asset.replace(ds, "{ds}", 1) if ds else asset


def test_every_check_of_the_definitions_is_declared_in_the_registry_as_the_ui_shows_it(demo: dg.Definitions) -> None:
    graph = demo.get_repository_def().asset_graph
    datasets = set(load_catalog(profile="demo"))
    held = {}
    for key in graph.asset_check_keys:
        spec = graph.get_check_spec(key)
        held[(key.name, _asset_pattern(key.asset_key.to_user_string(), datasets))] = (spec.blocking, spec.description)
    declared = {(d.name, d.asset): (d.blocking, d.description) for d in registry.CHECKS}
    assert held == declared


def test_every_check_of_the_definitions_is_alerted_on_when_it_fails_as_the_registry_says(
    demo: dg.Definitions, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = demo.get_repository_def().asset_graph.asset_check_keys
    assert {"hidden_states", "training_mix"} <= {key.asset_key.to_user_string() for key in checks}
    with dg.instance_for_test() as instance, Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        for key in checks:
            instance.report_runless_asset_event(
                dg.AssetCheckEvaluation(
                    asset_key=key.asset_key, check_name=key.name, passed=False,
                    severity=dg.AssetCheckSeverity(registry.check(key.name).severity),
                    description=f"{key.name} failed on purpose",
                )
            )  # fmt: skip
        tick(demo, instance, "quality_alerts", FROM_START)
        posted = " ".join(str(body) for body in receiver.bodies)
    announced = {key.name for key in checks if f"{key.name} failed on purpose" in posted}
    assert announced == {d.name for d in registry.CHECKS if d.alert}
    assert {d.name for d in registry.CHECKS if d.blocking} <= announced  # the capture's five among them
    assert {"truncation_rate", "length_shift"}.isdisjoint(announced)  # WARN: shown in the UI, not posted


def _one_run(
    defs: dg.Definitions, partition: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[dg.ExecuteInProcessResult, list[dict[str, Any]]]:
    """One run of every asset of `defs` on `partition`, both alert sensors ticked after it: the posted bodies."""
    with dg.instance_for_test() as instance, Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        cursors = {name: tick(defs, instance, name, None).cursor for name in SENSORS}
        job = defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(partition_key=partition, instance=instance, raise_on_error=False)
        for name, cursor in cursors.items():
            tick(defs, instance, name, cursor)
        return result, receiver.bodies


def test_a_run_a_blocking_check_stopped_still_announces_another_steps_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: `run_failure_alerts` skipped every run in which a blocking check failed, so an engine error
    in the same run (a range run over several datasets, say) was announced nowhere."""
    parts = dg.StaticPartitionsDefinition(SPEC.partition_keys)

    @dg.asset(name="b9_other", partitions_def=parts)
    def other() -> None:
        raise RuntimeError("engine at 127.0.0.1:1 refused the connection")

    defs = dg.Definitions(
        assets=[*stand_in_assets(SPEC), other],
        asset_checks=build_checks([SPEC]),
        sensors=build_sensors([SPEC]),
        resources={"storage": StorageResource(root=str(tmp_path))},
    )
    result, bodies = _one_run(defs, "00001", monkeypatch)  # 00001: the 87% "OK." regression
    assert not result.success
    assert EXPORT not in {m.asset_key for m in result.get_asset_materialization_events() if m.asset_key}
    headlines = [body["blocks"][0]["text"]["text"] for body in bodies]
    assert "ERROR check empty_response failed on b9_fixture (b9_fixture_validated) [00001]" in headlines
    runs = [body for body in bodies if body["text"].startswith("Run failed")]
    assert len(runs) == 1 and "engine at 127.0.0.1:1 refused the connection" in runs[0]["text"]
    assert len(bodies) == 2


def test_a_failed_capture_check_that_stops_its_run_is_announced_once(
    capture_asset: dict[str, Any],  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real capture over three shards, one of them then truncated on disk: the blocking `ids_match_mix`
    fails that shard and the run; its alert names the shard and what to do, and the run's alert is left out."""
    asset, resources = capture_asset["asset"], capture_asset["resources"]
    defs = dg.Definitions(assets=[asset], sensors=build_sensors(list(load_catalog(profile="demo").values())),
                          resources=resources)  # fmt: skip
    with dg.instance_for_test() as instance, Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        follow_the_mix(instance, 12)
        clean = dg.materialize([asset], resources=resources, instance=instance, tags=RANGE)
        cursors = {name: tick(defs, instance, name, None).cursor for name in SENSORS}
        path = Path(str(clean.asset_materializations_for_node(KEY.path[-1])[0].metadata["path"].value))
        planted = path / "specforge-eagle3" / "rows_0-2000" / "data_5.ckpt"  # row 5: in shard 00001
        planted.write_bytes(planted.read_bytes()[:-100])
        corrupt = dg.materialize([asset], resources=resources, instance=instance, tags=RANGE, raise_on_error=False)
        skips = [tick(defs, instance, name, cursor).skip_message for name, cursor in cursors.items()]
    assert not corrupt.success
    assert [body["blocks"][0]["text"]["text"] for body in receiver.bodies] == [
        f"ERROR check ids_match_mix failed on drafter ({layout.HIDDEN_STATES_ASSET}) [00001]"
    ]
    assert "re-materialize hidden_states partition 00001" in receiver.bodies[0]["text"]
    assert "failed on check(s) ids_match_mix: already announced" in (skips[1] or "")


def test_the_nightly_repair_re_judges_the_checks_the_registry_repairs(demo: dg.Definitions) -> None:
    """The repair schedule takes its checks from the registry and the definitions: `decontamination` (not a
    quality gate) triggers a repair and is re-run with the gates."""
    ds = next(iter(load_catalog(profile="demo").values()))
    triggers, rerun = repaired_checks(demo.get_repository_def().asset_graph, ds)
    assert [k.name for k in triggers] == [d.name for d in registry.CHECKS if d.repair == "checks"]
    assert "decontamination" in {k.name for k in triggers}
    assert [k.name for k in rerun] == [d.name for d in registry.CHECKS if d.stage == "validated"]


def test_a_failed_warn_check_posts_no_alert(monkeypatch: pytest.MonkeyPatch) -> None:
    defs = build_definitions([load_catalog(profile="demo")["b7_sharegpt"]])
    with dg.instance_for_test() as instance, Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey("b7_sharegpt_validated"), check_name="truncation_rate", passed=False,
                severity=dg.AssetCheckSeverity.WARN, description="truncation_rate failed on purpose",
            )
        )  # fmt: skip
        tick(defs, instance, "quality_alerts", FROM_START)
        assert receiver.bodies == []


def test_a_failed_canary_is_announced_once_though_the_estimate_step_failed_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary is a blocking check: the estimate's step fails on it and Dagster skips generation. That
    step's failure is the canary's to announce: one alert, not two."""
    monkeypatch.setenv(ENGINE_ENV, "openai")
    monkeypatch.delenv(POOL_ENV, raising=False)
    spec = standin_demo()["b7_sharegpt"].model_copy(update={"max_prompts": 30})  # the range's three shards
    assets = build_dataset_assets(spec)[:3]  # prompts, estimate, generation
    engine = EngineResource(kind="openai", model="m", api_key_env="")
    resources = {**shard_resources(StorageResource(root=str(tmp_path))), "engine": engine}
    defs = dg.Definitions(assets=assets, sensors=build_sensors([spec]), resources=resources)
    server = FakeOpenAI(Faults(fixed_text="OK."))  # the DFlash run: every reply "OK."
    server.start()
    try:
        monkeypatch.setenv("EAGLE_DATA_BASE_URL", f"http://127.0.0.1:{server.port}/v1")
        with dg.instance_for_test() as instance, Receiver() as receiver:
            monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
            cursors = {name: tick(defs, instance, name, None).cursor for name in SENSORS}
            result = dg.materialize(assets, instance=instance, tags=RANGE, resources=resources, raise_on_error=False)
            skips = [tick(defs, instance, name, cursor).skip_message for name, cursor in cursors.items()]
    finally:
        server.stop()
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == f"{spec.name}_estimate"  # failed on its blocking canary; generation skipped
    assert spec.name not in {e.step_key for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START}
    headlines = [body["blocks"][0]["text"]["text"] for body in receiver.bodies]
    assert headlines == [f"ERROR check canary failed on {spec.name} ({spec.name}_estimate)"], headlines
    assert any("already announced" in (skip or "") for skip in skips)
