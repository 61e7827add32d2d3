"""The shard stages run without Dagster, as the tests drive them: each stage's function, then its shards stored
by the one shard writer the IO manager uses (`write_shards`), so a test reads back what a run would have written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle_data import layout
from eagle_data.catalog import DatasetSpec, load_catalog
from eagle_data.runner import ShardFigures
from eagle_data.stages import generation, prompts, validation
from eagle_data.standins.openai_fake import Faults
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


STANDIN_TARGET = Faults().prompt_target  # the profile the stand-in servers render and count prompts with


def standin_demo() -> dict[str, DatasetSpec]:
    """The demo profile's entries for a run against a stand-in server: its model ("m") has no checkpoint to derive
    a target from, so they name the target it renders with, as a user of such a server sets `target`."""
    return {
        name: spec.model_copy(update={"target": STANDIN_TARGET}) for name, spec in load_catalog(profile="demo").items()
    }


def standin_catalog(folder: Path, **defaults: int | str) -> Path:
    """A user catalog ($EAGLE_DATA_CATALOG) for a CLI or UI run against a stand-in server: every dataset names the
    stand-ins' target, as `standin_demo` does in process, and the other `defaults` given (over the profile's)."""
    path = folder / "standin-catalog.toml"
    lines = [f"{key} = {value!r}".replace("'", '"') for key, value in {"target": STANDIN_TARGET, **defaults}.items()]
    path.write_text("\n".join(["[defaults]", *lines, ""]))
    return path
