"""The code location: `dagster dev -m eagle_data.definitions` or `dagster asset materialize -m ...`."""

from __future__ import annotations

import dagster as dg

from eagle_data.catalog import catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.checks import build_checks
from eagle_data.defs.drafter import build_decontamination_checks, build_drafter_assets
from eagle_data.defs.exports import build_exports
from eagle_data.defs.jobs import walk_catalog
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.defs.schedules import build_schedules
from eagle_data.defs.sensors import build_sensors

specs = list(catalog().values())
checks = [*build_checks(specs), *build_decontamination_checks(specs)]

defs = dg.Definitions(
    assets=[
        *(asset for spec in specs for asset in build_dataset_assets(spec)),
        build_exports(specs, checks),
        *build_drafter_assets(specs),
    ],
    asset_checks=checks,
    jobs=[walk_catalog],
    sensors=build_sensors(specs),
    schedules=build_schedules(specs),
    resources={"storage": StorageResource(), "engine": EngineResource()},
)
