"""The shard IO manager: every stage output that is a shard (prompts, generation, validated) is stored here,
one Parquet file per partition under the storage resource's root (a folder or S3, through dagster-aws's
S3Resource), and read back lazily by the asset downstream.

An asset returns its shards as a Mapping partition -> frame or bytes, made only when looked up
(`eagle_data.storage.shards`); a single-run range is handled here: `handle_output` walks
`context.asset_partition_keys`, so one file per partition and one shard in memory at a time, and records
each partition's `dagster/uri` and `shard_sha256` (the digest of the bytes stored). `load_input` hands the
downstream asset the upstream shards of its range, each read when looked up: never a pickle, never every
shard in memory. docs/design.md lists what stays outside (the result log, leases, reports, export files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from eagle_data.defs.instance import add_partition_metadata
from eagle_data.defs.messages import user_failure
from eagle_data.defs.metadata import SHARD_DIGEST, shard_locations
from eagle_data.defs.resources import StorageResource
from eagle_data.storage.shards import Shard, StoredShards, write_shards

SHARD_IO = "shard_io_manager"  # the resource key of every shard output
DATASET_TAG = "dataset"  # the tag naming an asset's dataset (its shards' first folder)


class ShardIOManager(dg.ConfigurableIOManager):
    """Partitioned Parquet shards under the storage resource's root."""

    storage: StorageResource

    @user_failure
    def handle_output(self, context: dg.OutputContext, obj: Mapping[str, Shard]) -> None:
        store = self.storage.store(check=False)  # the asset's body checked it before making anything
        asset = context.asset_key.to_user_string()
        dataset = context.asset_spec.tags[DATASET_TAG]
        stored = write_shards(store, dataset, asset, obj, context.asset_partition_keys)
        for key, shard in stored.items():  # per partition: a range run's events each name their own file
            metadata = {**shard_locations(store, dataset, asset, key), SHARD_DIGEST: shard.sha256}
            add_partition_metadata(context, metadata, key)

    @user_failure
    def load_input(self, context: dg.InputContext) -> StoredShards:
        upstream = context.upstream_output
        assert upstream is not None  # a shard input always comes from an asset output
        dataset = upstream.asset_spec.tags[DATASET_TAG]
        asset = context.asset_key.to_user_string()
        # unchecked: nothing is read before the asset's body checks the root (a bad root is its one line)
        return StoredShards(self.storage.store(check=False), dataset, asset, context.asset_partition_keys)


def shard_resources(storage: StorageResource, **others: Any) -> dict[str, Any]:
    """The resources of the dataset assets: `storage`, the shard IO manager on it, and `others`."""
    return {"storage": storage, SHARD_IO: ShardIOManager(storage=storage), **others}
