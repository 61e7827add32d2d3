"""A stage's shards as a Mapping partition -> frame, read or made only when looked up, and the one writer
of shard files (the Dagster IO manager calls it; so do scripts that run stages without Dagster).

A stage hands over its shards lazily, so a range over 1,800 partitions never holds more than one: a value
is a frame (serialized here) or the bytes the stage already serialized (written as they are, so a digest
the stage took is the digest of the stored file). Each stored shard's digest is recorded (`storage.digests`)
unless its stage records it itself (validation, in the quality record), and a stored shard is read only once
its bytes are the recorded ones."""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from eagle_data import layout
from eagle_data.storage import ShardStore, parquet_bytes
from eagle_data.storage.digests import FileDigest, checked_shard, record_shard

Shard = pl.DataFrame | bytes


@dataclass(frozen=True)
class Stored:
    """One written shard: where, its bytes' sha256 and size, and its row count."""

    uri: str
    digest: FileDigest
    rows: int

    @property
    def sha256(self) -> str:
        return self.digest.sha256


class LazyShards(Mapping[str, Shard]):
    """Partitions whose shard `make(partition)` builds when looked up; `written(partition, stored)` hears
    of each one once its file is stored (e.g. to drop what the file now holds)."""

    records_digest = False  # True: the stage records each shard's digest itself (write_shards does not)

    def __init__(
        self,
        partitions: Sequence[str],
        make: Callable[[str], Shard],
        written: Callable[[str, Stored], None] | None = None,
    ) -> None:
        self.partitions, self.make, self.written = list(partitions), make, written

    def __getitem__(self, key: str) -> Shard:
        if key not in self.partitions:
            raise KeyError(key)
        return self.make(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.partitions)

    def __len__(self) -> int:
        return len(self.partitions)


class StoredShards(LazyShards):
    """An asset's stored shards, each read from the store when looked up (`columns`: only those), and only once
    its bytes are those its stage recorded (a `digests.ChangedFile` line otherwise)."""

    def __init__(
        self,
        store: ShardStore,
        dataset: str,
        asset: str,
        partitions: Sequence[str],
        columns: Sequence[str] | None = None,
    ) -> None:
        self.store, self.dataset, self.asset, self.columns = store, dataset, asset, columns
        super().__init__(partitions, self.read)

    def read(self, key: str) -> pl.DataFrame:
        data = self.store.shard_bytes(self.dataset, self.asset, key)
        checked_shard(self.store, self.dataset, self.asset, key, data)
        return self.store.parse_shard(self.dataset, self.asset, key, data, self.columns)

    def __getitem__(self, key: str) -> pl.DataFrame:
        if key not in self.partitions:
            raise KeyError(key)
        return self.read(key)


def shards_written(store: ShardStore, dataset: str, asset: str) -> list[str]:
    """Partition keys of the shards an asset has written (its top-level .parquet files)."""
    keys = (layout.parse(key) for key in store.list(layout.asset_prefix(dataset, asset)))
    return [key.partition for key in keys if key is not None and key.kind == "shard" and key.asset == asset]


def row_count(data: bytes) -> int:
    """A parquet file's rows, from its footer."""
    return pl.scan_parquet(io.BytesIO(data)).select(pl.len()).collect().item()


def write_shards(
    store: ShardStore, dataset: str, asset: str, shards: Mapping[str, Shard], partitions: Sequence[str] | None = None
) -> dict[str, Stored]:
    """Write each of `partitions` (default: every one `shards` holds) as `{ds}/{asset}/{partition}.parquet`,
    one at a time, each followed by its digest record unless its stage records the digest itself; returns what
    was stored, by partition."""
    stored: dict[str, Stored] = {}
    recorded = isinstance(shards, LazyShards) and shards.records_digest
    for key in shards if partitions is None else partitions:
        shard = shards[key]
        data, rows = (shard, row_count(shard)) if isinstance(shard, bytes) else (parquet_bytes(shard), shard.height)
        uri = store.write_bytes(layout.shard(dataset, asset, key), data)
        stored[key] = Stored(uri, FileDigest.of(data), rows)
        if not recorded:
            record_shard(store, dataset, asset, key, stored[key].digest)
        if isinstance(shards, LazyShards) and shards.written is not None:
            shards.written(key, stored[key])
    return stored


class SpilledShards(LazyShards):
    """Shards a stage already serialized to take their digest (recorded by the stage, e.g. in validation's quality
    records), kept in a local temp folder until written, so memory holds one shard whatever the range; each file
    goes once its shard is stored."""

    records_digest = True

    def __init__(self) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="eagle-shards-")
        super().__init__([], self.read, self.drop)

    def add(self, partition: str, data: bytes) -> None:
        self.path(partition).write_bytes(data)
        self.partitions.append(partition)

    def path(self, partition: str) -> Path:
        return Path(self.folder.name) / f"{partition}.parquet"

    def read(self, partition: str) -> bytes:
        return self.path(partition).read_bytes()

    def drop(self, partition: str, _stored: Stored) -> None:
        self.path(partition).unlink(missing_ok=True)
