"""Metadata the Dagster UI shows on an asset's page, built from what the pure rooms return: the dataset
report's headline as markdown tables, figures rounded as a person reads them, and code versions that
follow the settings an asset reads. Kept apart from the asset bodies so they stay short call sites."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import dagster as dg

from eagle_data.report import DatasetReport, rounded

ROW_COUNT = "dagster/row_count"  # Dagster's own: the asset page's "Row count"
URI = "dagster/uri"  # Dagster's own: where a partition's shard is
SHARD_DIGEST = "shard_sha256"  # metadata of a shard partition and of each check on it: its bytes' sha256


def rounded_figures(figures: Mapping[str, Any]) -> dict[str, Any]:
    """Numeric figures with floats rounded to 4 places; other values as they are."""
    return {name: rounded(value) for name, value in figures.items()}


def dataset_report_metadata(report: DatasetReport) -> dict[str, Any]:
    """The report's headline on the validated asset's latest materialization: its figures, its checks and
    per-shard tables (markdown), and the dataset's row count over every judged shard (the catalog's "Row
    count"; each partition's own rows are its `rows` figure)."""
    metadata: dict[str, Any] = {
        **report.numbers(),
        "dataset_checks": dg.MetadataValue.md(report.checks_table()),
        ROW_COUNT: int(report.figures.numbers.get("rows", 0)),
    }
    if table := report.shards_table():
        metadata["dataset_shard_table"] = dg.MetadataValue.md(table)
    return metadata


def settings_version(stage: int, settings: Any) -> str:
    """A code version: the stage's number (bumped when its code changes what it writes) and a hash of the
    settings it reads, so Dagster marks what was made under other settings as "code version changed"."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{stage}-{digest}"
