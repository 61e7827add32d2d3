"""The blocking `on_policy` check of every `{ds}_validated` (eagle_data/quality/on_policy.py): each shard's
sampled rows, scored by the target at validation (their stored `on_policy` column), against what the
target's own sampling distribution predicts. One evaluation per shard, naming the bytes it judged, so the
export leaves out a shard it failed (`training_mix` gates on every blocking check)."""

from typing import Any

import dagster as dg

from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions
from eagle_data.defs.checks import judged_partitions, report_shards, validated_key
from eagle_data.defs.messages import user_failure
from eagle_data.defs.registry import check_outcome, check_specs
from eagle_data.defs.resources import StorageResource
from eagle_data.quality import on_policy, registry, sampled
from eagle_data.quality.records import Judged
from eagle_data.report import record_judged, validated_bytes
from eagle_data.storage import digest, read_columns

ON_POLICY = registry.implemented("on_policy", ("on_policy",))[0].name  # judged by on_policy.shard_verdict


def on_policy_check(spec: DatasetSpec) -> dg.AssetChecksDefinition:
    key, shards = validated_key(spec), partitions(spec)
    limits = on_policy.limits_of(spec.on_policy)

    @dg.multi_asset_check(
        name=f"{spec.name}_on_policy", specs=check_specs("on_policy", key, shards), can_subset=True,
        description=f"{spec.title}: the target's own score of the rows.",
    )  # fmt: skip
    @user_failure
    def check(context: dg.AssetCheckExecutionContext, storage: StorageResource):
        store = storage.store()

        def judge(partition: str) -> tuple[str, list[dict[str, Any]]]:
            data = validated_bytes(store, spec.name, partition)  # the bytes validation stored, or one line
            frame = read_columns(data, [on_policy.COLUMN, sampled.COLUMN])
            verdict, reported = on_policy.shard_verdict(frame, limits), sampled.numbers(frame)
            line = "; ".join(filter(None, (verdict.line, sampled.cross_check(reported))))  # shown, never judged
            judged = Judged(ON_POLICY, verdict.passed, line, digest(data), context.run.run_id)
            record_judged(spec, store, partition, judged, context.log.warning)  # for the export's admission
            metadata = {**verdict.details, **reported, "figure": verdict.figure, "threshold": verdict.threshold}
            metadata = {k: v for k, v in metadata.items() if v is not None}
            return digest(data), [check_outcome(ON_POLICY, verdict.passed, line, metadata)]

        yield from report_shards(context, key, judged_partitions(context, key, shards), judge)

    return check


def build_on_policy_checks(specs: list[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    return [on_policy_check(spec) for spec in specs]
