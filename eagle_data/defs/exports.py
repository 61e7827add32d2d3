"""The exports: per-dataset conversations JSONL and tokenized parquet, and the weighted training mix.

Downstream of every `{ds}_validated`, so a failed blocking check stops it in the same run. A blocking
check only stops steps of its own run, so the export also holds the gate across runs: it reads only the
validated shards whose stored outcome of every blocking check passed on the very bytes on storage
(`exports.admit`, over the quality records on storage: `exports.gate_records`; nothing from the event log),
and names every shard it leaves out, with the reason.

The asset carries its blocking `trainer_parity` check (`exports.check`): the trainer files it wrote, run
through the trainer's own released code, must give our ids and masks (docs/exports.md).
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections.abc import Sequence

import dagster as dg

from eagle_data import exports, layout
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import catalog_labels
from eagle_data.defs.checks import validated_key
from eagle_data.defs.drafter import follow_the_mix
from eagle_data.defs.messages import file_locations, leveled, uri_locations, user_failure
from eagle_data.defs.registry import check_specs
from eagle_data.defs.resources import StorageResource
from eagle_data.exports.check import PARITY_CHECK, check_exports
from eagle_data.exports.parity import ParityError, TrainerMissing
from eagle_data.exports.settings import ExportSettings, export_settings
from eagle_data.stage_table import EXPORT
from eagle_data.stages.export import export, export_keys
from eagle_data.storage import ShardStore


class ExportConfig(dg.Config):
    seed: int = 0  # the mix's shuffle and sub-sampling; the same seed gives the same rows


def admission(store: ShardStore, spec: DatasetSpec, blocking: Sequence[dg.AssetCheckKey]) -> exports.Admission:
    """Which validated shards of `spec` the export may read, gated by the `blocking` checks: from storage only."""
    return exports.admit(exports.gate_records(spec, store, [key.name for key in blocking]))


def parity_result(store: ShardStore, specs: Sequence[DatasetSpec], config: ExportSettings) -> dg.AssetCheckResult:
    """The `trainer_parity` verdict: failed when a trainer would train on data other than ours or the parity
    run cannot start (no tokenizer, no template). Where the trainer's code is not installed (a plain `pip
    install` of this project: SpecForge cannot be one of its extras, docs/facts.md) it says "not verified" as a
    WARN failure: shown and announced, and not blocking, since nothing was found wrong."""
    try:
        report = check_exports(store, specs, config)
    except TrainerMissing as exc:
        return dg.AssetCheckResult(
            check_name=PARITY_CHECK, passed=False, severity=dg.AssetCheckSeverity.WARN, description=str(exc)
        )
    except ParityError as exc:
        return dg.AssetCheckResult(check_name=PARITY_CHECK, passed=False, description=str(exc))
    figures = {f"{where}/{p.file}": dg.MetadataValue.json(p.figures()) for where, _, p in report.files}
    return dg.AssetCheckResult(
        check_name=PARITY_CHECK, passed=not report.failures, description=report.summary(),
        metadata={"parity": dg.MetadataValue.md(report.table()), **figures},
    )  # fmt: skip


def build_exports(specs: Sequence[DatasetSpec], checks: Sequence[dg.AssetChecksDefinition]) -> dg.AssetsDefinition:
    """The `training_mix` asset over `specs`, gated by every blocking check among `checks`."""
    blocking = [check.key for c in checks for check in c.check_specs if check.blocking]
    gated_by = {spec.name: [k for k in blocking if k.asset_key == validated_key(spec)] for spec in specs}

    @dg.asset(
        name="training_mix",
        group_name="exports",
        deps=[layout.validated_asset(spec.name) for spec in specs],
        kinds={"parquet", "json"},
        check_specs=check_specs("parity", "training_mix"),
        code_version=EXPORT.mix_version(specs),
        **catalog_labels(
            "export",
            (o for spec in specs for o in spec.owners),
            "Trainer files per dataset (catalog [exports] formats: SpecForge's pre-tokenized prompts.jsonl by "
            "default) and tokenized parquet, and the weighted mix (catalog mix_weight) of every training row of "
            "the shards that passed their blocking checks.",
        ),
    )
    @user_failure
    def training_mix(
        context: dg.AssetExecutionContext, config: ExportConfig, storage: StorageResource
    ) -> dg.MaterializeResult:
        store, settings = storage.store(), export_settings()
        gate = {spec.name: admission(store, spec, gated_by[spec.name]) for spec in specs}
        figures = export(list(specs), store, gate, seed=config.seed, log=leveled(context.log), formats=settings.formats)
        if "excluded" in figures:
            figures["excluded"] = dg.MetadataValue.md(figures["excluded"])
        files = {f"{spec.name}_{kind}": key for spec in specs if f"{spec.name}_rows" in figures
                 for kind, key in export_keys(spec, settings.formats).items()}  # fmt: skip
        figures.update({**uri_locations(store, figures), **file_locations(store, files)})
        figures["capture_shards"] = len(follow_the_mix(context.instance, figures["mix_rows"]))
        return dg.MaterializeResult(metadata=figures, check_results=[parity_result(store, specs, settings)])

    return training_mix
