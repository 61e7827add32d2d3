"""The code location: `dagster dev` (pyproject.toml's [tool.dg]) or `dagster asset materialize -m ...`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import TracebackType

import dagster as dg

from eagle_data.catalog import CatalogError, DatasetSpec, current
from eagle_data.cli import NO_PARTITION, no_partition_line
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.automation import AutomationSettings, load_automation_settings, with_automation
from eagle_data.defs.backfills import backfill_status_sensor
from eagle_data.defs.catalog_order import catalog_order_sensor
from eagle_data.defs.checks import build_checks
from eagle_data.defs.drafter import CaptureResource, build_decontamination_checks, build_drafter_assets
from eagle_data.defs.exports import build_exports
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.on_policy import build_on_policy_checks
from eagle_data.defs.pools import dead_run_reaper, pool_watch_executor
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.defs.schedules import build_schedules
from eagle_data.defs.sensors import build_sensors
from eagle_data.drafter.settings import DrafterSettings
from eagle_data.exports.settings import ExportSettings

SECTIONS = (ExportSettings, DrafterSettings, AutomationSettings)  # every catalog table besides the datasets


def build_definitions(specs: Sequence[DatasetSpec]) -> dg.Definitions:
    """Everything Dagster loads, built from catalog entries (the benchmarks build it from their own)."""
    checks = [*build_checks(specs), *build_decontamination_checks(specs), *build_on_policy_checks(list(specs))]
    assets, automation = with_automation(
        [
            *(asset for spec in specs for asset in build_dataset_assets(spec)),
            build_exports(specs, checks),
            *build_drafter_assets(specs),
        ],
        specs,
        load_automation_settings(),
    )
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        sensors=[
            *build_sensors(specs), catalog_order_sensor(specs), dead_run_reaper(), backfill_status_sensor(), *automation
        ],
        schedules=build_schedules(specs),
        resources=shard_resources(StorageResource(), engine=EngineResource(), capture=CaptureResource()),
        executor=pool_watch_executor,
    )


def one_line_errors(datasets: Sequence[str]) -> None:
    """Two errors that end the `dagster` CLI's process (which loads this module) reach the terminal as one line
    instead of a traceback: a catalog error, and Dagster's own "Asset has partitions, but no '--partition'
    option was provided" (a `check.failed` in dagster/_cli/asset.py) with the flag to add. Python's own hook for
    uncaught exceptions; any other exception goes to the hook that was there before."""
    previous = sys.excepthook

    def one_line(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, CatalogError):
            print(f"eagle-data: {exc}", file=sys.stderr)
        elif NO_PARTITION in str(exc):  # a CheckError, known by Dagster's own words (its class is private)
            print(no_partition_line(sys.argv, list(datasets)), file=sys.stderr)
        else:
            previous(kind, exc, tb)

    sys.excepthook = one_line


def _catalog() -> list[DatasetSpec]:
    """The catalog's entries, after every table of it was validated (`SECTIONS`): a bad value anywhere stops the
    load, not the step that would read it hours later. A catalog error leaves the `dagster` CLI as its one line, not
    under the import traceback of whatever loaded this module; a code server still reports it as an error."""
    try:
        loaded = current()
        for section in SECTIONS:
            loaded.section(section)
        specs = list(loaded.datasets.values())
    except CatalogError:
        one_line_errors([])
        raise
    one_line_errors([s.name for s in specs])
    return specs


defs = build_definitions(_catalog())
