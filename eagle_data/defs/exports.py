"""The exports: per-dataset conversations JSONL and tokenized parquet, and the weighted training mix.

Downstream of every `{ds}_validated`, so a failed blocking check upstream stops it in the same run.
"""

import dagster as dg

from eagle_data import pipeline
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import catalog_labels
from eagle_data.defs.resources import StorageResource


class ExportConfig(dg.Config):
    seed: int = 0  # the mix's shuffle and sub-sampling; the same seed gives the same rows


def build_exports(specs: list[DatasetSpec]) -> dg.AssetsDefinition:
    @dg.asset(
        name="training_mix",
        group_name="exports",
        deps=[pipeline.validated_asset(spec) for spec in specs],
        kinds={"parquet", "json"},
        **catalog_labels("export", (o for spec in specs for o in spec.owners), "SpecForge conversations JSONL "
                         "and tokenized parquet per dataset, and the weighted mix (catalog mix_weight) of every "
                         "passing row."),
    )
    def training_mix(config: ExportConfig, storage: StorageResource) -> dg.MaterializeResult:
        figures = pipeline.export(specs, storage.store(), seed=config.seed)
        return dg.MaterializeResult(metadata=figures)

    return training_mix
