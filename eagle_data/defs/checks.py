"""Asset checks of every catalog dataset: the quality gates of eagle_data.quality on `{ds}_validated`.

One multi-asset check per dataset runs every gate on the shard(s) of the run, so the validated frame is
read once; a range run is judged shard by shard (one bad shard cannot hide among good ones).
`empty_response` and `token_structure` are blocking: when one fails, the run fails and the exports
downstream do not run. Check metadata carries `figure`, `threshold` and `partitions`, which alerts quote.
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
import io
import warnings
from collections.abc import Iterator, Sequence

import dagster as dg
import polars as pl

from eagle_data import pipeline, quality
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions, previous_figure
from eagle_data.defs.resources import StorageResource
from eagle_data.report import partition_label
from eagle_data.storage import ShardStore, StorageError


def validated_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey(pipeline.validated_asset(spec))


def check_keys(spec: DatasetSpec) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(validated_key(spec), d.name) for d in quality.CHECKS]


def read_for_checks(store: ShardStore, spec: DatasetSpec, keys: Sequence[str]) -> Iterator[tuple[str, pl.DataFrame]]:
    """Validated shards one at a time, without token lists and conversations (the checks never read
    them), so a check over a long partition range stays small in memory."""
    asset = pipeline.validated_asset(spec)
    for key in keys:
        if not store.shard_exists(spec.name, asset, key):
            raise StorageError(f"{store.uri(store.shard_key(spec.name, asset, key))} does not exist: "
                               f"materialize {asset} partition {key} first")  # fmt: skip
        data = io.BytesIO(store.read_bytes(store.shard_key(spec.name, asset, key)))
        columns = [c for c in pl.read_parquet_schema(data) if c in quality.CHECK_COLUMNS]
        data.seek(0)
        yield key, pl.read_parquet(data, columns=columns)


def to_result(key: dg.AssetKey, r: quality.CheckResult, partitions: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=r.name,
        passed=r.passed,
        severity=dg.AssetCheckSeverity(r.severity),
        description=r.message,
        metadata={**r.metadata(), "partitions": partitions},
    )


def dataset_checks(spec: DatasetSpec) -> dg.AssetChecksDefinition:
    key = validated_key(spec)
    with warnings.catch_warnings():  # partitioned checks are a Dagster preview: one warning per spec otherwise
        warnings.simplefilter("ignore", dg.PreviewWarning)
        specs = [
            dg.AssetCheckSpec(
                d.name, asset=key, description=d.description, blocking=d.blocking, partitions_def=partitions(spec)
            )
            for d in quality.CHECKS
        ]

    @dg.multi_asset_check(name=f"{spec.name}_quality_checks", specs=specs, description=f"{spec.title}: quality gates.")
    def checks(context: dg.AssetCheckExecutionContext, storage: StorageResource):
        keys = list(context.partition_keys)
        previous = previous_figure(context.instance, key, context.run.run_id)
        inputs = quality.Inputs(spec.checks, spec.generation.thinking, previous)
        for r in quality.run_checks_by_shard(read_for_checks(storage.store(), spec, keys), inputs):
            yield to_result(key, r, partition_label(keys))

    return checks


def build_checks(specs: Sequence[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    """One multi-asset check per dataset, partitioned like the dataset's assets."""
    return [dataset_checks(spec) for spec in specs]
