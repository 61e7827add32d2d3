"""Stage 1, prompts: the source normalized once (the saved prompt index), cut into shards of `shard_size`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagle_data import layout, sources
from eagle_data.catalog import DatasetSpec, shard_index, shard_key
from eagle_data.storage import ShardStore
from eagle_data.storage.shards import LazyShards, StoredShards, shards_written

Log = Callable[[str], None]


@dataclass(frozen=True)
class PromptsMade:
    """What a prompts call made: each partition's prompt count, the prompt index's figures (the whole
    source's, so they are not per shard and never add up), and the shards, each cut when looked up."""

    prompts: dict[str, int]
    index: dict[str, Any]
    shards: LazyShards

    def to_metadata(self) -> dict[str, Any]:
        return {"prompts": sum(self.prompts.values()), **self.index}


def make_prompts(
    spec: DatasetSpec, store: ShardStore, partitions: list[str], source_path: str | None = None, warn: Log = print
) -> PromptsMade:
    """Normalize the source once (the saved prompt index) and cut the requested shards from it; returns
    each partition's prompt count and the index's figures (rows read, skipped by reason).

    When the source changed since the index was built, the index is rebuilt and `warn` names the prompt
    shards written from the old one that this call does not rewrite: they must be re-materialized."""
    index = sources.load_index(spec, store, source_path)
    asset = layout.prompts_asset(spec.name)
    if index.rebuilt:
        stale = sorted(set(shards_written(store, spec.name, asset)) - set(partitions))
        redo = f"; re-materialize the {len(stale)} {asset} partitions cut from the old one"
        warn(f"{spec.name}: {index.rebuilt}; rebuilt it" + (f"{redo} ({stale[0]}...{stale[-1]})" if stale else ""))
    filled = -(-index.prompts // spec.shard_size)  # partitions the source's prompts fill
    empty = [key for key in partitions if shard_index(key) >= filled]
    if empty:
        raise sources.SourceError(
            f"dataset {spec.name!r}: the source yields {index.prompts:,} prompts, which fill partitions "
            f"{shard_key(0)}-{shard_key(filled - 1)}; {len(empty)} asked for ({empty[0]}...{empty[-1]}) would be "
            f"empty: set max_prompts to {index.prompts} for {spec.name} in the catalog and reload the definitions"
        )
    counts = {key: min(spec.shard_size, index.prompts - shard_index(key) * spec.shard_size) for key in partitions}
    figures = {
        "prompts_in_source": index.prompts,
        "rows_read": index.rows_read,
        "skipped": sum(index.skipped.values()),
        **{f"skipped_{reason}": n for reason, n in index.skipped.items()},
        "source": index.source,
    }
    return PromptsMade(counts, figures, LazyShards(partitions, lambda key: index.shard(spec, key)))


class PromptShards(StoredShards):
    """A dataset's stored prompt shards, each read only when looked up: the runner looks a shard up when it
    reaches it, so a range over 1,800 partitions never holds them all."""

    def __init__(self, spec: DatasetSpec, store: ShardStore, partitions: list[str]) -> None:
        super().__init__(store, spec.name, layout.prompts_asset(spec.name), partitions)
