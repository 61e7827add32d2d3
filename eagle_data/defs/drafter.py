"""Drafter inputs: the EAGLE-3 draft vocabulary mappings built from the training mix, and the blocking
benchmark-decontamination check of every `{ds}_validated`.

The draft vocabulary is downstream of `training_mix`, so a failed blocking check upstream stops it in
the same run. The bodies only call `eagle_data.drafter`.
"""

from typing import Any

import dagster as dg

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import catalog_labels, partitions
from eagle_data.defs.messages import file_locations, uri_locations
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter.decontam import BenchmarkIndex
from eagle_data.drafter.evalsets import benchmark_index, unread
from eagle_data.drafter.outputs import (
    PLAN_ASSET,
    DecontamReport,
    decontamination_report,
    write_draft_vocab,
    write_hidden_state_plan,
)
from eagle_data.drafter.settings import load_drafter_settings
from eagle_data.report import partition_label

DECONTAMINATION = "decontamination"


def build_drafter_assets(specs: list[DatasetSpec]) -> list[dg.AssetsDefinition]:
    owners = [o for spec in specs for o in spec.owners]

    @dg.asset(
        name="draft_vocab",
        group_name="drafter",
        deps=["training_mix"],
        kinds={"pytorch"},
        **catalog_labels(
            "drafter",
            owners,
            "EAGLE-3 draft vocabulary mappings (d2t/t2d) per catalog [drafter] "
            "draft_vocab_sizes, from the mix's supervised-token frequencies; cached by target "
            "tokenizer, mix content and size.",
        ),
    )
    def draft_vocab(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
        sizes = load_drafter_settings().draft_vocab_sizes
        figures = write_draft_vocab(specs, storage.store(), sizes, log=context.log.info)
        return dg.MaterializeResult(metadata={**figures, **uri_locations(storage.store(), figures)})

    @dg.asset(
        name=PLAN_ASSET,
        group_name="drafter",
        deps=["training_mix"],
        kinds={"json"},
        **catalog_labels(
            "drafter",
            owners,
            "Disk bytes and GPU-hours of capturing hidden states of the mix for "
            "offline EAGLE-3 training, for the catalog's [drafter.hidden_states] recipe: size the "
            "capture before running it.",
        ),
    )
    def hidden_state_plan(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
        recipe = load_drafter_settings().hidden_states
        sized, table = write_hidden_state_plan(storage.store(), recipe)
        context.log.info(f"hidden states: {sized.total_bytes / 1e9:,.1f} GB, {sized.gpu_hours:,.1f} GPU-hours")
        plan = file_locations(storage.store(), {"plan_path": layout.drafter_file(PLAN_ASSET, "plan.json")})
        return dg.MaterializeResult(metadata={**sized.figures(), "plan": dg.MetadataValue.md(table), **plan})

    return [draft_vocab, hidden_state_plan]


def _outcome(
    key: dg.AssetKey, report: DecontamReport, index: BenchmarkIndex, sources: dict[str, str], partitions: str
) -> dict[str, Any]:
    """What a check result and a check evaluation share."""
    return {
        "asset_key": key,
        "check_name": DECONTAMINATION,
        "passed": report.passed,
        "severity": dg.AssetCheckSeverity.ERROR,
        "description": report.message(key.to_user_string()),
        "metadata": {
            "figure": report.leaked,
            "unread_benchmarks": dg.MetadataValue.json(report.unread),
            "threshold": 0,
            "partitions": partitions,
            "rows": report.rows,
            "matched_rows": report.matched,
            "per_benchmark": dg.MetadataValue.json(report.per_benchmark),
            "per_match": dg.MetadataValue.json(report.per_match),
            "matched_ids": dg.MetadataValue.json(report.matched_ids),
            "leaked_ids": dg.MetadataValue.json(report.leaked_ids),
            "benchmarks": dg.MetadataValue.json(
                {name: f"{index.items.get(name, 0)} items, {where}" for name, where in sources.items()}
            ),
        },
    }


def decontamination_check(spec: DatasetSpec) -> dg.AssetChecksDefinition:
    key = dg.AssetKey(layout.validated_asset(spec.name))
    check_spec = dg.AssetCheckSpec(
        DECONTAMINATION,
        asset=key,
        blocking=True,
        partitions_def=partitions(spec),
        description="No row kept for training overlaps a benchmark item (exact after normalization, or a "
        "shared n-gram); overlapping rows are set aside with the verdict `contaminated`.",
    )

    @dg.multi_asset_check(name=f"{spec.name}_decontamination", specs=[check_spec], can_subset=True)
    def check(context: dg.AssetCheckExecutionContext, storage: StorageResource):
        index, sources = benchmark_index(load_drafter_settings().decontamination)
        store, missing = storage.store(), unread(sources)
        if context.has_partition_key or context.has_partition_key_range:
            keys = list(context.partition_keys)
            report = decontamination_report(spec.name, store, keys, index, missing)
            yield dg.AssetCheckResult(**_outcome(key, report, index, sources, partition_label(keys)))
            return
        # A checks-only run without a partition (the Checks tab): each materialized shard on its own.
        keys = sorted(context.instance.get_materialized_partitions(key))
        if not keys:
            raise dg.Failure(f"no partition of {key.to_user_string()} is materialized yet: materialize one first")
        leaked = []
        for partition in keys:
            report = decontamination_report(spec.name, store, [partition], index, missing)
            outcome = _outcome(key, report, index, sources, partition)
            yield dg.AssetCheckEvaluation(**outcome, blocking=True, partition=partition)
            leaked += [partition] if not report.passed else []
        if leaked:
            raise dg.Failure(f"decontamination failed on {', '.join(leaked)}; see each shard's evaluation")

    return check


def build_decontamination_checks(specs: list[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    return [decontamination_check(spec) for spec in specs]
