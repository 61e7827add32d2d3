"""What was written is what is read: the sha256 and size of every file a stage stores, checked by every later
read before anything uses the bytes.

A stage records each file's digest where it records its outcome: a prompts or generation shard in its digest
record (`{ds}/{asset}/_digest/{partition}.json`, written by `storage.shards.write_shards` after the file), a
validated shard in its quality record (`quality.records`), the export's files in the export record
(`training_mix/training_mix/_written.json`), a hidden-state capture shard's files beside its capture record
(`stages.hidden_states`). A reader hashes the bytes it has read (no second read of the store) and refuses
them when they differ, in one line naming the file, what changed and the command that makes it again
(`ChangedFile`). A file with no record (written before digests were recorded, or outside a stage) is read as
it is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eagle_data import layout
from eagle_data.storage.errors import StorageError

if TYPE_CHECKING:
    from eagle_data.storage import ShardStore

VERSION = 1  # of the stored digest records
CODE_LOCATION = "eagle_data.definitions"


@dataclass(frozen=True)
class FileDigest:
    """A stored file's sha256 and size in bytes."""

    sha256: str
    size: int

    @classmethod
    def of(cls, data: bytes) -> FileDigest:
        return cls(hashlib.sha256(data).hexdigest(), len(data))

    @classmethod
    def of_file(cls, path: Path) -> FileDigest:
        """A local file's digest, read in chunks (a mix of gigabytes never in memory)."""
        with path.open("rb") as fh:
            return cls(hashlib.file_digest(fh, "sha256").hexdigest(), path.stat().st_size)


def materialize_command(asset: str, partition: str | None = None) -> str:
    """The command that makes `asset` (one partition of it) again."""
    where = f" --partition {partition}" if partition else ""
    return f"dagster asset materialize -m {CODE_LOCATION} --select {asset}{where}"


class ChangedFile(StorageError):
    """A stored file whose bytes are not those its stage recorded: nothing may use them."""

    def __init__(self, uri: str, recorded: FileDigest, found: FileDigest, repair: str) -> None:
        sizes = f"{recorded.size:,} bytes recorded, {found.size:,} found" if recorded.size else f"{found.size:,} bytes"
        self.figures = f"(sha256 {recorded.sha256[:16]} recorded, {found.sha256[:16]} found; {sizes})"
        self.what = f"changed since it was written {self.figures}"
        super().__init__(f"{uri} {self.what}: nothing uses it; make it again with `{repair}`")
        self.uri, self.recorded, self.found, self.repair = uri, recorded, found, repair


def check(uri: str, found: FileDigest, recorded: FileDigest | None, repair: str) -> None:
    """Raise ChangedFile when a file read as `found` is not what was `recorded` (None: nothing recorded; a size of
    0: a record older than sizes)."""
    if recorded is not None and (found.sha256 != recorded.sha256 or recorded.size not in (0, found.size)):
        raise ChangedFile(uri, recorded, found, repair)


@dataclass(frozen=True)
class DigestRecord:
    """The digests of the files one stage step wrote, by storage key."""

    files: dict[str, FileDigest]
    version: int = VERSION

    def to_json(self) -> bytes:
        return json.dumps({"version": self.version, "files": {k: asdict(d) for k, d in self.files.items()}}).encode()

    @staticmethod
    def from_json(data: bytes) -> DigestRecord | None:
        """The record, or None when it is of another version or not a record at all (then nothing is checked)."""
        try:
            raw = json.loads(data)
            if raw.get("version") != VERSION:
                return None
            return DigestRecord({k: FileDigest(str(d["sha256"]), int(d["size"])) for k, d in raw["files"].items()})
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def write_record(store: ShardStore, key: str, files: Mapping[str, FileDigest]) -> None:
    store.write_bytes(key, DigestRecord(dict(files)).to_json())


def read_record(store: ShardStore, key: str) -> DigestRecord | None:
    return DigestRecord.from_json(store.read_bytes(key)) if store.exists(key) else None


def recorded_shard(store: ShardStore, dataset: str, asset: str, partition: str) -> FileDigest | None:
    """The digest a prompts or generation shard was stored with, or None when none was recorded."""
    record = read_record(store, layout.digest_record(dataset, asset, partition))
    return record.files.get(layout.shard(dataset, asset, partition)) if record else None


def record_shard(store: ShardStore, dataset: str, asset: str, partition: str, digest: FileDigest) -> None:
    key = layout.shard(dataset, asset, partition)
    write_record(store, layout.digest_record(dataset, asset, partition), {key: digest})


def checked_shard(store: ShardStore, dataset: str, asset: str, partition: str, data: bytes) -> bytes:
    """A prompts or generation shard's bytes, just read, once they are what its stage recorded."""
    found = FileDigest.of(data)
    recorded = recorded_shard(store, dataset, asset, partition)
    check(store.uri(layout.shard(dataset, asset, partition)), found, recorded, materialize_command(asset, partition))
    return data
