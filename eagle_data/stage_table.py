"""The stage table: one record per stage of the flow, the one place that says what a stage is called, how the UI
orders it, what it reads, how it is partitioned and which catalog settings change what it writes.

Pure data (no Dagster): `eagle_data/defs/assets.py` generates each dataset's assets from the records (name, tag,
inputs, partitions, code version), and the generation record's settings are the resume key's
(`runner/resultlog.py` `resume_key`), so a catalog key that changes generation output is added once, here, and
both the code version Dagster shows and the key that decides which stored replies are reused follow it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from eagle_data import layout
from eagle_data.catalog import DatasetSpec

# shard: the dataset's prompt shards; capture: the mix's capture shards (hidden_states; the drafter's other
# assets are not partitioned); none: one materialization over every dataset.
Partitioning = Literal["shard", "capture", "none"]


@dataclass(frozen=True)
class Stage:
    """One stage. `settings`: the catalog entry's keys (DatasetSpec fields) whose values change what it writes;
    they feed its code version and, for generation, the resume key. `reads`: the stage whose shards it loads as
    its input; `after`: the stages it runs after without loading their output."""

    name: str
    tag: str  # the UI's `stage` tag: the catalog lists assets by name, the tag gives the flow order
    partitioning: Partitioning
    asset: Callable[[str], str] | None = None  # a dataset's asset name; None: the stage is not per dataset
    reads: str = ""
    after: tuple[str, ...] = ()
    makes_shards: bool = False  # its output is shards, stored by the shard IO manager
    code: int = 1  # bumped when its code changes what it writes
    settings: tuple[str, ...] = ()

    def values(self, spec: DatasetSpec) -> dict[str, Any]:
        """The settings this stage reads, as they are in `spec` (Python values: the resume key hashes these)."""
        return spec.model_dump(include=set(self.settings))

    def version(self, spec: DatasetSpec) -> str:
        """A dataset's code version of this stage: its number and a hash of its settings, so Dagster marks what
        was made under other settings ("code version changed")."""
        return settings_version(self.code, self.values(spec))

    def mix_version(self, specs: Iterable[DatasetSpec]) -> str:
        """The code version of a stage over every dataset (the export): its settings in each entry."""
        return settings_version(self.code, {spec.name: self.values(spec) for spec in specs})


def settings_version(code: int, settings: Any) -> str:
    """`{code}-{hash of settings}`: a code version that follows the settings a stage reads."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{code}-{digest}"


PROMPTS = Stage(
    "prompts", "1-prompts", "shard", layout.prompts_asset, makes_shards=True,
    settings=("hub_id", "config", "split", "source", "adapter", "shard_size", "max_prompt_chars"),
)  # fmt: skip
ESTIMATE = Stage(
    "estimate", "2-estimate", "shard", layout.estimate_asset, after=("prompts",),
    settings=("canary_prompts", "token_budget", "cost_budget_usd", "generation", "checks"),
)  # fmt: skip
GENERATION = Stage(
    "generation", "3-generation", "shard", layout.generation_asset, reads="prompts", after=("estimate",),
    makes_shards=True, settings=("regenerate", "max_turns", "generation"),
)  # fmt: skip
VALIDATED = Stage(
    "validated", "4-validated", "shard", layout.validated_asset, reads="generation", makes_shards=True,
    settings=("target", "mask_empty_think", "checks"),
)  # fmt: skip
EXPORT = Stage("export", "5-export", "none", after=("validated",), settings=("mix_weight", "target"))
DRAFTER = Stage("drafter", "6-drafter", "capture", after=("export",))  # its settings: the catalog's [drafter]

STAGES: tuple[Stage, ...] = (PROMPTS, ESTIMATE, GENERATION, VALIDATED, EXPORT, DRAFTER)
BY_NAME = {stage.name: stage for stage in STAGES}
DATASET_STAGES = tuple(stage for stage in STAGES if stage.asset is not None)  # each dataset's group, in order


def stage(name: str) -> Stage:
    return BY_NAME[name]


def asset_of(name: str, dataset: str) -> str:
    """The asset of stage `name` for `dataset` (a per-dataset stage)."""
    make = BY_NAME[name].asset
    assert make is not None, f"stage {name} is not per dataset"
    return make(dataset)
