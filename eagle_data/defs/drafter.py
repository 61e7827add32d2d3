"""Drafter inputs: the EAGLE-3 draft vocabulary mappings built from the training mix, the hidden-state
plan and capture (partitioned by capture shard, with blocking checks judged shard by shard), and the blocking
benchmark-decontamination check of every `{ds}_validated`.

The draft vocabulary is downstream of `training_mix`, so a failed blocking check upstream stops it in
the same run. The bodies only call `eagle_data.stages`.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from eagle_data import layout, settings
from eagle_data.catalog import PROFILE_ENV, DatasetSpec, shard_key
from eagle_data.defs.assets import catalog_labels, partitions
from eagle_data.defs.checks import judged_partitions, report_shards
from eagle_data.defs.messages import file_locations, uri_locations, user_failure
from eagle_data.defs.metadata import SHARD_DIGEST
from eagle_data.defs.pools import tie_to_run_worker
from eagle_data.defs.registry import check_outcome, check_specs
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter import verify
from eagle_data.drafter.capture import resolve_target
from eagle_data.drafter.settings import load_drafter_settings
from eagle_data.quality.decontam import BenchmarkIndex, benchmark_index
from eagle_data.quality.evalsets import unread
from eagle_data.stage_table import settings_version
from eagle_data.stages.decontamination import DECONTAMINATION, DecontamReport, decontamination_report, record_outcome
from eagle_data.stages.draft_vocab import write_draft_vocab
from eagle_data.stages.hidden_states import PLAN_ASSET, verify_stored, write_hidden_state_plan, write_hidden_states


def build_drafter_assets(specs: list[DatasetSpec]) -> list[dg.AssetsDefinition]:
    owners = [o for spec in specs for o in spec.owners]
    drafter = load_drafter_settings()

    @dg.asset(
        name="draft_vocab",
        group_name="drafter",
        deps=["training_mix"],
        kinds={"pytorch"},
        code_version=settings_version(1, drafter.draft_vocab_sizes),
        **catalog_labels(
            "drafter",
            owners,
            "EAGLE-3 draft vocabulary mappings (d2t/t2d) per catalog [drafter] "
            "draft_vocab_sizes, from the mix's supervised-token frequencies; cached by target "
            "tokenizer, mix content and size.",
        ),
    )
    @user_failure  # e.g. "materialize training_mix first": one line, no trace
    def draft_vocab(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
        drafter = load_drafter_settings()
        formats = drafter.capture.formats  # the chosen trainers pick the mapping files
        figures = write_draft_vocab(specs, storage.store(), drafter.draft_vocab_sizes, context.log.info, formats)
        return dg.MaterializeResult(metadata={**figures, **uri_locations(storage.store(), figures)})

    @dg.asset(
        name=PLAN_ASSET,
        group_name="drafter",
        deps=["training_mix"],
        kinds={"json"},
        code_version=settings_version(1, drafter.hidden_states.model_dump(mode="json")),
        **catalog_labels(
            "drafter",
            owners,
            "Disk bytes and GPU-hours of capturing hidden states of the mix for "
            "offline EAGLE-3 training, for the catalog's [drafter.hidden_states] recipe: size the "
            "capture before running it.",
        ),
    )
    @user_failure
    def hidden_state_plan(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
        recipe = load_drafter_settings().hidden_states
        sized, table = write_hidden_state_plan(storage.store(), recipe)
        context.log.info(f"hidden states: {sized.total_bytes / 1e9:,.1f} GB, {sized.gpu_hours:,.1f} GPU-hours")
        plan = file_locations(storage.store(), {"plan_path": layout.drafter_file(PLAN_ASSET, "plan.json")})
        return dg.MaterializeResult(metadata={**sized.figures(), "plan": dg.MetadataValue.md(table), **plan})

    return [draft_vocab, hidden_state_plan, build_capture_asset(owners, specs)]


class CaptureResource(dg.ConfigurableResource):
    """The target checkpoint whose hidden states `hidden_states` captures, and where it runs."""

    checkpoint: str | None = Field(
        None,
        description="A local transformers checkpoint folder of the mix's target (EAGLE_DATA_CAPTURE_CHECKPOINT; "
        "the demo profile: the demo model).",
    )
    device: str | None = Field(
        None, description="cuda, cuda:1 or cpu (EAGLE_DATA_CAPTURE_DEVICE); default cuda when present."
    )

    def resolved(self) -> tuple[str, str]:
        return resolve_target(self.checkpoint, self.device, demo=settings.get(PROFILE_ENV) == "demo")


def _metadata_value(value: Any) -> Any:
    return dg.MetadataValue.json(value) if isinstance(value, (dict, list)) else value


# `hidden_states`' partitions: one per capture shard of the latest mix, set when `training_mix` materializes
# (follow_the_mix), so every partition the UI shows can be filled.
CAPTURE_SHARDS = dg.DynamicPartitionsDefinition(name="hidden_states_shards")


def follow_the_mix(instance: dg.DagsterInstance, mix_rows: int) -> list[str]:
    """Make `hidden_states`' partitions the capture shards of a mix of `mix_rows` rows (at most the catalog's
    [drafter.capture] max_rows): adds the missing keys, drops those past the mix's end; returns the keys."""
    configured = load_drafter_settings().capture
    keys = [shard_key(i) for i in range(min(-(-mix_rows // configured.shard_rows), configured.partitions))]
    existing = set(instance.get_dynamic_partitions(CAPTURE_SHARDS.name))
    if added := [key for key in keys if key not in existing]:
        instance.add_dynamic_partitions(CAPTURE_SHARDS.name, added)
    for stale in existing - set(keys):
        instance.delete_dynamic_partition(CAPTURE_SHARDS.name, stale)
    return keys


def build_capture_asset(owners: list[str], specs: list[DatasetSpec]) -> dg.AssetsDefinition:
    """`hidden_states`, one partition per capture shard of the mix (CAPTURE_SHARDS). It can subset, so its
    checks also run on their own (the Checks tab's "Execute all"): such a run re-verifies the stored shards
    and never captures."""
    configured, shards = load_drafter_settings().capture, CAPTURE_SHARDS
    key = dg.AssetKey(layout.HIDDEN_STATES_ASSET)
    spec = dg.AssetSpec(
        key,
        group_name="drafter",
        deps=["training_mix"],
        kinds={"pytorch", "safetensors"},
        code_version=settings_version(1, configured.model_dump(mode="json")),
        **catalog_labels(
            "drafter",
            owners,
            f"The target's hidden states over the mix, {configured.shard_rows:,} rows per shard, for the trainers "
            f"chosen in catalog [drafter.capture] formats ({', '.join(configured.formats)}); verified against "
            "the mix, a re-capture and the plan.",
        ),
    )

    @dg.multi_asset(
        name=layout.HIDDEN_STATES_ASSET,
        specs=[spec],
        check_specs=check_specs("capture", key, shards),
        partitions_def=shards,
        backfill_policy=dg.BackfillPolicy.single_run(),
        can_subset=True,
    )
    @user_failure
    def hidden_states(context: dg.AssetExecutionContext, storage: StorageResource, capture: CaptureResource):
        tie_to_run_worker(context)  # a killed run stops capturing (GPU time nobody records), as generation does
        settings, store = load_drafter_settings().capture, storage.store()
        if key not in context.selected_asset_keys:  # checks only: re-verify what is stored, capture nothing
            keys = judged_partitions(context, key, shards)
            found = verify_stored(specs, store, keys, settings, *capture.resolved(), log=context.log.info)
        else:
            keys = list(context.partition_keys)
            figures, captured = write_hidden_states(
                specs, store, keys, settings, *capture.resolved(), log=context.log.info
            )
            for partition, shard in captured.items():  # each partition's materialization: its own shard's figures
                own = {name: _metadata_value(value) for name, value in shard.figures.items()}
                context.add_asset_metadata({**own, SHARD_DIGEST: shard.found.shard_sha256}, partition_key=partition)
            metadata = {name: _metadata_value(value) for name, value in figures.items()}
            metadata["path"] = dg.MetadataValue.path(figures["path"])
            yield dg.MaterializeResult(asset_key=key, metadata=metadata)  # recorded before the evaluations that name it
            found = {partition: shard.found for partition, shard in captured.items()}

        def judge(partition: str) -> tuple[str, list[dict[str, Any]]]:
            shard = found[partition]
            return shard.shard_sha256, [
                check_outcome(name, shard.passed(name), shard.line(name), shard.metadata()) for name in verify.CHECKS
            ]

        yield from report_shards(context, key, keys, judge)

    return hidden_states


def _outcome(report: DecontamReport, index: BenchmarkIndex, sources: dict[str, str], asset: str) -> dict[str, Any]:
    """One shard's decontamination evaluation (AssetCheckEvaluation fields)."""
    return check_outcome(
        DECONTAMINATION,
        report.passed,
        report.message(asset),
        {
            "figure": report.leaked,
            "unread_benchmarks": dg.MetadataValue.json(report.unread),
            "threshold": 0,
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
    )


def decontamination_check(spec: DatasetSpec) -> dg.AssetChecksDefinition:
    key, shards = dg.AssetKey(layout.validated_asset(spec.name)), partitions(spec)
    specs = check_specs("decontamination", key, shards)

    @dg.multi_asset_check(name=f"{spec.name}_decontamination", specs=specs, can_subset=True)
    @user_failure
    def check(context: dg.AssetCheckExecutionContext, storage: StorageResource):
        index, sources = benchmark_index(load_drafter_settings().decontamination)
        store, missing = storage.store(), unread(sources)

        def judge(partition: str) -> tuple[str, list[dict[str, Any]]]:  # each shard on its own
            report = decontamination_report(spec.name, store, [partition], index, missing)
            record_outcome(spec, store, partition, report, context.run.run_id, context.log.warning)  # for admission
            return report.digests[partition], [_outcome(report, index, sources, key.to_user_string())]

        yield from report_shards(context, key, judged_partitions(context, key, shards), judge)

    return check


def build_decontamination_checks(specs: list[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    return [decontamination_check(spec) for spec in specs]
