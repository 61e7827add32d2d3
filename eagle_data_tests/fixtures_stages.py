"""The shard stages run without Dagster, as the tests drive them: each stage's function, then its shards stored
by the one shard writer the IO manager uses (`write_shards`), so a test reads back what a run would have written."""

from __future__ import annotations

from typing import Any

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.runner import ShardFigures
from eagle_data.stages import generation, prompts, validation
from eagle_data.storage import ShardStore
from eagle_data.storage.shards import StoredShards, write_shards
from eagle_data.types import Engine


def write_prompts(spec: DatasetSpec, store: ShardStore, partitions: list[str], *args: Any, **kwargs: Any
                  ) -> prompts.PromptsMade:  # fmt: skip
    made = prompts.make_prompts(spec, store, partitions, *args, **kwargs)
    write_shards(store, spec.name, layout.prompts_asset(spec.name), made.shards)
    return made


def generate(spec: DatasetSpec, store: ShardStore, partitions: list[str], engine: Engine, **kwargs: Any
             ) -> tuple[dict[str, Any], dict[str, ShardFigures]]:  # fmt: skip
    inputs = prompts.PromptShards(spec, store, partitions)
    made = generation.generate(spec, store, inputs, engine, **kwargs)
    write_shards(store, spec.name, layout.generation_asset(spec.name), made.shards)
    return made.figures, made.per_partition


def validate(spec: DatasetSpec, store: ShardStore, partitions: list[str], *args: Any, **kwargs: Any
             ) -> validation.Validation:  # fmt: skip
    generations = StoredShards(store, spec.name, layout.generation_asset(spec.name), partitions)
    done = validation.validate(spec, store, generations, *args, **kwargs)
    write_shards(store, spec.name, layout.validated_asset(spec.name), done.shards)
    return done
