"""The Dagster layer: assets, checks, resources, sensors and schedules built from the catalog.

Thin by design: everything here wires the pure rooms (sources, runner, targets, quality, storage).

Dagster marks some features this project relies on as beta or preview and warns at every definition
(one line per asset, in every process that loads the code location: hundreds per `dagster dev`). Those
known warnings are filtered here, each by its message, so a new beta feature still warns until someone
adds it to this list on purpose.
"""

import warnings

import dagster as dg

KNOWN_DAGSTER_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # single-run backfills: a range run fills an engine with many shards at once
    (dg.BetaWarning, r"Parameter `backfill_policy` of function `asset`"),
    # partitioned asset checks: each shard judged on its own
    (dg.PreviewWarning, r"Specifying a partitions_def on an AssetCheckSpec"),
)

for _category, _message in KNOWN_DAGSTER_WARNINGS:
    warnings.filterwarnings("ignore", message=_message, category=_category)
