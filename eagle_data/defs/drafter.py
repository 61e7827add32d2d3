"""Drafter inputs built from the training mix: the EAGLE-3 draft vocabulary mappings.

Downstream of `training_mix`, so a failed blocking check upstream stops them in the same run. The bodies
only call `eagle_data.drafter`.
"""

import dagster as dg

from eagle_data.catalog import DatasetSpec
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter.outputs import write_draft_vocab
from eagle_data.drafter.settings import load_drafter_settings


def build_drafter_assets(specs: list[DatasetSpec]) -> list[dg.AssetsDefinition]:
    @dg.asset(
        name="draft_vocab",
        group_name="drafter",
        deps=["training_mix"],
        kinds={"pytorch"},
        description="EAGLE-3 draft vocabulary mappings (d2t/t2d) per catalog [drafter] draft_vocab_sizes, from "
        "the mix's supervised-token frequencies; cached by target tokenizer, mix content and size.",
    )
    def draft_vocab(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
        sizes = load_drafter_settings().draft_vocab_sizes
        figures = write_draft_vocab(specs, storage.store(), sizes, log=context.log.info)
        return dg.MaterializeResult(metadata=figures)

    return [draft_vocab]
