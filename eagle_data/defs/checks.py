"""Asset checks of every catalog dataset: the quality gates of eagle_data.quality on `{ds}_validated`.

Validation evaluates every gate once per shard and stores the results in the shard's quality record;
one multi-asset check per dataset reports those stored results (rebuilding a stale record from its
shard), so a check re-run never re-reads token ids. A range run is judged shard by shard (one bad shard
cannot hide among good ones).
`empty_response` and `token_structure` are blocking: when one fails, the run fails and the exports
downstream do not run. Check metadata carries `figure`, `threshold` and `partitions`, which alerts quote.
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from eagle_data import pipeline, quality, report
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions
from eagle_data.defs.resources import StorageResource
from eagle_data.report import partition_label


def validated_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey(pipeline.validated_asset(spec))


def check_keys(spec: DatasetSpec) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(validated_key(spec), d.name) for d in quality.CHECKS]


def _outcome(key: dg.AssetKey, r: quality.CheckResult, partitions: str) -> dict[str, Any]:
    """What a check result and a check evaluation share."""
    return {
        "asset_key": key,
        "check_name": r.name,
        "passed": r.passed,
        "severity": dg.AssetCheckSeverity(r.severity),
        "description": r.message,
        "metadata": {**r.metadata(), "partitions": partitions},
    }


def to_result(key: dg.AssetKey, r: quality.CheckResult, partitions: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(**_outcome(key, r, partitions))


def check_evaluations(
    spec: DatasetSpec, records: Mapping[str, quality.ShardRecord]
) -> list[dg.AssetCheckEvaluation]:
    """The gates' results from validation's shard records, for op-based jobs (walk_catalog) that report
    materializations themselves: one evaluation per check and partition, for `context.log_event`."""
    return [
        dg.AssetCheckEvaluation(**_outcome(validated_key(spec), r, key), blocking=r.blocking, partition=key)
        for key, record in sorted(records.items())
        for r in record.results
    ]


def dataset_checks(spec: DatasetSpec) -> dg.AssetChecksDefinition:
    key = validated_key(spec)
    specs = [
        dg.AssetCheckSpec(
            d.name, asset=key, description=d.description, blocking=d.blocking, partitions_def=partitions(spec)
        )
        for d in quality.CHECKS
    ]

    @dg.multi_asset_check(name=f"{spec.name}_quality_checks", specs=specs, description=f"{spec.title}: quality gates.")
    def checks(context: dg.AssetCheckExecutionContext, storage: StorageResource):
        keys, store = list(context.partition_keys), storage.store()
        results = {k: report.read_record(spec, store, k, context.log.warning).results for k in keys}
        for r in quality.combine(results):
            yield to_result(key, r, partition_label(keys))

    return checks


def build_checks(specs: Sequence[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    """One multi-asset check per dataset, partitioned like the dataset's assets."""
    return [dataset_checks(spec) for spec in specs]
