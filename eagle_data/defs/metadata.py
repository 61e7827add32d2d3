"""Metadata the Dagster UI shows on an asset's page, built from what the pure rooms return: the dataset
report's headline as markdown tables, figures rounded as a person reads them, and code versions that
follow the settings an asset reads. Kept apart from the asset bodies so they stay short call sites."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

from eagle_data.files_server import browser_link
from eagle_data.report import DatasetReport, rounded
from eagle_data.storage import ShardStore

ROW_COUNT = "dagster/row_count"  # Dagster's own: the asset page's "Row count"
SHARD_ROWS = "rows"  # a partition's own rows, beside the dataset's in ROW_COUNT
URI = "dagster/uri"  # Dagster's own: where a partition's shard is (a path: a click copies it)
SHARD_LINK = "shard_link"  # the same shard as a link that opens, where one can (browser_link)
SHARD_DIGEST = "shard_sha256"  # metadata of a shard partition and of each check on it: its bytes' sha256
REFUSED_FOR = "refused_for"  # a step's refusal (dg.Failure metadata): the failed check it refused for


def rounded_figures(figures: Mapping[str, Any]) -> dict[str, Any]:
    """Numeric figures with floats rounded to 4 places; other values as they are."""
    return {name: rounded(value) for name, value in figures.items()}


def dataset_summary(report: DatasetReport, link: str | None) -> dg.MetadataValue:
    """The dataset in two lines, first on the validated asset's page: rows kept over rows judged, the checks'
    outcome, and the quality report's link (the page lists Metadata in the order it was given)."""
    numbers = report.figures.numbers
    failed = [r.name for r in report.results if not r.passed]
    checks = f"checks: {len(report.results) - len(failed)} passed" + (f", FAILED: {', '.join(failed)}" * bool(failed))
    headline = (f"**{int(numbers.get('train_rows', 0))} of {int(numbers.get('rows', 0))} rows kept for training, "
                f"{report.shards} shard(s); {checks}.**")  # fmt: skip
    opened = f"[Open the quality report]({link})" if link else f"Quality report: `{report.uri}` (docs/running.md)"
    return dg.MetadataValue.md(f"{headline}\n\n{opened}")


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


def row_count_metadata(rows: Mapping[str, int], others: Iterable[Mapping[str, Any]]) -> dict[str, dict]:
    """Per written partition: its own `rows`, and as `dagster/row_count` the dataset's rows over every shard
    (this run's, and `others`: the latest materialization metadata of the partitions it did not write). The
    asset page's "Row count" is the latest materialization's `dagster/row_count`, whichever partition that was
    (docs/running.md): with a shard's own count there, a dataset of 36 rows in shards of 10 reads "10"."""
    total = sum(rows.values())
    for metadata in others:
        # `rows` since the dataset's total took `dagster/row_count`; before, the shard's own count was there
        value = metadata.get(SHARD_ROWS) or metadata.get(ROW_COUNT)
        total += int(value.value) if value is not None and isinstance(value.value, int) else 0
    return {partition: {SHARD_ROWS: count, ROW_COUNT: total} for partition, count in rows.items()}


def shard_locations(store: ShardStore, dataset: str, asset: str, partition: str) -> dict[str, dg.MetadataValue]:
    """Where a partition's shard is: Dagster's `dagster/uri` (a path), and a link that opens beside it through
    the files server (never a signed URL), so every written shard is one click from its partition's page."""
    key = store.shard_key(dataset, asset, partition)
    link = browser_link(store, key)
    return {URI: dg.MetadataValue.path(store.uri(key)), **({SHARD_LINK: dg.MetadataValue.url(link)} if link else {})}
