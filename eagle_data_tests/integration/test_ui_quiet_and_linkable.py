"""What users see: no Dagster warning walls, owners and stage order in the Catalog, links that open."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import pytest

from eagle_data.catalog import Adapter, CatalogError, DatasetSpec, catalog
from eagle_data.defs.assets import engine_kind
from eagle_data.stage_table import DATASET_STAGES, DRAFTER, EXPORT, asset_of


def python(code: str, **extra: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that shows every warning every time (`-W always`), on the demo profile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    env.update(EAGLE_DATA_PROFILE="demo", **extra)
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def test_importing_the_definitions_prints_no_warning():
    out = python("import eagle_data.definitions")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr == "", f"{out.stderr.count('Warning')} warning(s):\n{out.stderr[:2000]}"


def test_only_the_known_dagster_warnings_are_filtered():
    out = python("import warnings, dagster, eagle_data.defs\n"
                 "for category in (dagster.BetaWarning, dagster.PreviewWarning):\n"
                 "    warnings.warn('a new feature', category)")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BetaWarning: a new feature" in out.stderr and "PreviewWarning: a new feature" in out.stderr


def test_every_asset_has_catalog_owners_and_a_stage_tag_in_flow_order():
    from eagle_data.definitions import defs

    graph, specs = defs.resolve_asset_graph(), catalog()
    for name, spec in specs.items():
        nodes = [graph.get(dg.AssetKey(asset_of(stage.name, name))) for stage in DATASET_STAGES]
        assert [n.tags["stage"] for n in nodes] == sorted(stage.tag for stage in DATASET_STAGES)
        assert all(n.tags["dataset"] == name and n.owners == list(spec.owners) and n.description.startswith("Stage ")
                   for n in nodes)  # fmt: skip
        assert nodes[2].tags["engine"] == engine_kind()
    mix = graph.get(dg.AssetKey("training_mix"))
    assert mix.tags["stage"] == EXPORT.tag and mix.owners == ["team:eagle-data"]
    for name in ("draft_vocab", "hidden_state_plan"):
        node = graph.get(dg.AssetKey(name))
        assert node.tags["stage"] == DRAFTER.tag and node.owners == ["team:eagle-data"]


def test_an_owner_that_dagster_would_refuse_is_a_catalog_error():
    with pytest.raises(ValueError, match="must each be an email or 'team:<name>'"):
        DatasetSpec(name="b9_x", adapter=Adapter(prompt_field="q"), owners=("alice",))
    assert DatasetSpec(name="b9_x", adapter=Adapter(prompt_field="q"), owners=("a@b.org", "team:ml")).owners
    assert issubclass(CatalogError, ValueError)


def test_the_alert_sensors_run_by_default_only_where_a_webhook_is_set(monkeypatch: pytest.MonkeyPatch):
    from eagle_data.defs.sensors import build_sensors

    specs = list(catalog().values())
    monkeypatch.delenv("EAGLE_DATA_ALERT_WEBHOOK", raising=False)
    assert {s.name: s.default_status for s in build_sensors(specs)} == {
        "quality_alerts": dg.DefaultSensorStatus.STOPPED, "run_failure_alerts": dg.DefaultSensorStatus.STOPPED,
    }  # fmt: skip
    monkeypatch.setenv("EAGLE_DATA_ALERT_WEBHOOK", "http://127.0.0.1:9/hook")
    assert {s.default_status for s in build_sensors(specs)} == {dg.DefaultSensorStatus.RUNNING}


IDLE_S = 600
SENSOR_LINES_PER_TICK = 2  # dagster/_daemon/sensor.py: "Checking for new runs for sensor: X", then "... skipped ..."
STARTUP_LINES = 10  # measured: Dagster's launch banner, the daemons' list, two cursor warnings, the webserver's address


def idle_lines(seconds: int, **env: str) -> tuple[int, dict[str, int]]:
    """The lines an idle `dagster dev` writes in `seconds`: its start, then two per tick of each sensor running
    by default (the daemon runs a due sensor every 5 s at most), with the environment the test set."""
    out = python("from eagle_data.definitions import defs\n"
                 "for s in defs.sensors:\n"
                 "    print(s.name, s.default_status.value, s.minimum_interval_seconds or 30)\n"
                 "print('schedules', sum(s.default_status.value == 'RUNNING' for s in defs.schedules))",
                 **env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    *sensors, schedules = (line.split() for line in out.stdout.splitlines())
    assert schedules == ["schedules", "0"]
    ticking = {name: int(interval) for name, status, interval in sensors if status == "RUNNING"}
    return STARTUP_LINES + sum(SENSOR_LINES_PER_TICK * (seconds // max(5, s)) for s in ticking.values()), ticking


def test_an_idle_dagster_dev_logs_under_100_lines_in_10_minutes():
    """The daemon logs two INFO lines per sensor tick; schedules stopped by default log nothing. Measured by
    hand (docs/running.md): 72 lines in 10 idle minutes (dead_run_reaper and backfill_status)."""
    lines, ticking = idle_lines(IDLE_S)
    assert lines < 100, ticking


def test_an_idle_dagster_dev_with_a_webhook_logs_under_100_lines_in_5_minutes():
    """Regression: with a webhook set the two alert sensors ticked every 5 s: 159 lines in 5 idle minutes,
    measured (docs/running.md); at 30 s, 58."""
    lines, ticking = idle_lines(300, EAGLE_DATA_ALERT_WEBHOOK="http://127.0.0.1:9/hook")
    assert {"quality_alerts", "run_failure_alerts"} <= set(ticking) and lines < 100, ticking
