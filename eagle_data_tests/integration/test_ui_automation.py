"""Declarative automation, opt-in in the catalog: with `[automation] eager_exports`, a new validated shard
requests `training_mix` and the cheap drafter inputs downstream, and a new mix those inputs (never
`hidden_states`); with `validated_fail_after_hours`, each `{ds}_validated` has a freshness policy. Off by
default. Evaluated by Dagster's own automation evaluator against a real instance."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from eagle_data.catalog import load_catalog
from eagle_data.definitions import build_definitions
from eagle_data.defs.automation import SENSOR

AUTOMATED = ("training_mix", "draft_vocab", "hidden_state_plan", "hidden_states")


def requested(result: dg.EvaluateAutomationConditionsResult) -> set[str]:
    return {name for name in AUTOMATED if result.get_num_requested(dg.AssetKey(name))}


def test_opted_in_exports_follow_new_validated_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "catalog.toml"
    user.write_text("[automation]\neager_exports = true\nvalidated_fail_after_hours = 24\n")
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    defs = build_definitions(list(load_catalog(profile="demo").values()))
    sensor = next(s for s in defs.sensors if s.name == SENSOR)
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    graph = defs.resolve_asset_graph()
    policy = graph.get(dg.AssetKey("b7_sharegpt_validated")).freshness_policy
    assert isinstance(policy, dg.FreshnessPolicy) and policy.fail_window.to_timedelta().total_seconds() == 86_400
    with dg.instance_for_test() as instance:
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert requested(first) == set()
        instance.report_runless_asset_event(dg.AssetMaterialization("b7_sharegpt_validated", partition="00000"))
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        # The mix, and with it the drafter inputs downstream (Dagster counts a dependency requested in the same
        # evaluation as updated): one run in dependency order.
        assert requested(second) == {"training_mix", "draft_vocab", "hidden_state_plan"}
        instance.report_runless_asset_event(dg.AssetMaterialization("training_mix"))  # a mix made by hand
        third = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor)
        assert requested(third) == {"draft_vocab", "hidden_state_plan"}  # hidden_states: GPU hours, by hand


def test_without_the_catalog_table_nothing_is_automated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAGLE_DATA_CATALOG", raising=False)
    defs = build_definitions(list(load_catalog(profile="demo").values()))
    graph = defs.resolve_asset_graph()
    assert all(graph.get(key).automation_condition is None for key in graph.get_all_asset_keys())
    assert all(graph.get(key).freshness_policy is None for key in graph.get_all_asset_keys())
    assert SENSOR not in {s.name for s in defs.sensors}
