"""Declarative automation, opt-in in the catalog's `[automation]` table (off by default: a real export or
draft vocabulary is a deliberate step, and an automation sensor ticks in the `dagster dev` terminal).

`eager_exports = true` makes `training_mix` and the cheap drafter inputs (`draft_vocab`,
`hidden_state_plan`) materialize when an upstream shard is new: a validated shard for the mix, a new mix
for the drafter inputs. `hidden_states` stays manual (GPU hours: size them with the plan first). Their
sensor, `eager_exports`, then runs by default. `validated_fail_after_hours` puts a freshness policy on
every `{ds}_validated`: failing when its latest shard is older than that.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import dagster as dg
from pydantic import Field

from eagle_data import layout
from eagle_data.catalog import DatasetSpec, Section, current

EAGER_ASSETS = ("training_mix", "draft_vocab", "hidden_state_plan")
SENSOR = "eager_exports"
# "Eager on new shards": any dependency updated since the last evaluation, none still being written, not
# already running. (Dagster's `eager()` also waits for every upstream partition to exist, which a dataset
# still being generated never satisfies.)
ON_NEW_SHARDS = (
    dg.AutomationCondition.any_deps_updated()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("on new upstream shards")


MAX_FRESHNESS_HOURS = 24 * 366  # a freshness window past a year is a typo (and `inf` overflows a timedelta)


class AutomationSettings(Section):
    """The catalog's `[automation]` table. Attributes:
    eager_exports: training_mix, draft_vocab and hidden_state_plan materialize on new upstream shards.
    validated_fail_after_hours: a freshness policy on each {ds}_validated (0: none; at most a year).
    """

    TABLE = "automation"

    eager_exports: bool = False
    validated_fail_after_hours: float = Field(0.0, ge=0, le=MAX_FRESHNESS_HOURS)


def load_automation_settings() -> AutomationSettings:
    """`[automation]` of the current catalog, validated."""
    return current().section(AutomationSettings)


def with_automation(
    assets: Sequence[dg.AssetsDefinition], specs: Sequence[DatasetSpec], settings: AutomationSettings
) -> tuple[list[dg.AssetsDefinition], list[dg.SensorDefinition]]:
    """`assets` with the catalog's automation conditions and freshness policies, and the sensor that
    evaluates them (none when nothing is automated)."""
    validated = {layout.validated_asset(spec.name) for spec in specs}
    fresh = (
        dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=settings.validated_fail_after_hours))
        if settings.validated_fail_after_hours
        else None
    )

    def automate(spec: dg.AssetSpec) -> dg.AssetSpec:
        name = spec.key.to_user_string()
        if settings.eager_exports and name in EAGER_ASSETS:
            spec = spec.replace_attributes(automation_condition=ON_NEW_SHARDS)
        if fresh is not None and name in validated:
            spec = spec.replace_attributes(freshness_policy=fresh)
        return spec

    changed = list(dg.map_asset_specs(automate, assets))
    sensors = []
    if settings.eager_exports:
        sensors.append(dg.AutomationConditionSensorDefinition(
            SENSOR, target=dg.AssetSelection.assets(*EAGER_ASSETS), default_status=dg.DefaultSensorStatus.RUNNING,
            minimum_interval_seconds=60, emit_backfills=False,
            description="Materializes training_mix and the drafter inputs on new upstream shards (catalog "
            "[automation] eager_exports).",
        ))  # fmt: skip
    return changed, sensors
