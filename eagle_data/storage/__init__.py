"""Parquet shards on a local folder or S3, written atomically, under one path scheme.

Keys are built and parsed by `eagle_data.layout` (shards: `{root}/{dataset}/{asset}/{partition}.parquet`).
One code path: `ShardStore` holds no branch on where the root is; it calls its file system, chosen once
from the root's scheme: a folder (`storage.local`: temp file + rename) or a bucket (`storage.s3`: a PUT is
atomic by the protocol). A reader never sees a half-written shard.
Shard files are written by `storage.shards.write_shards`, which the Dagster shard IO manager calls; the result
log, leases, reports and export files are written here directly: docs/design.md says why.
"""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data import layout, settings
from eagle_data.storage.errors import ROOT_ENV, CorruptFile, StorageError, UnwritableRoot
from eagle_data.storage.local import LocalFiles, write_failure
from eagle_data.storage.s3 import RETRY_ENV, S3Files, default_client, retry_window_s

DEFAULT_ROOT = "eagle-output"
__all__ = [
    "RETRY_ENV", "ROOT_ENV", "CorruptFile", "ShardStore", "StorageError", "UnwritableRoot", "default_root", "digest",
    "file_digest", "parquet_bytes", "read_columns", "retry_window_s", "write_failure",
]  # fmt: skip


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    """A frame as every shard and index block is stored: zstd parquet with column statistics."""
    buf = io.BytesIO()
    frame.write_parquet(buf, compression="zstd", statistics=True)
    return buf.getvalue()


def digest(data: bytes) -> str:
    """The sha256 of stored bytes: what a check judged, compared with what an export reads."""
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    """The sha256 of a local file's bytes, read in chunks (a source or a mix of gigabytes never in memory)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def read_columns(data: bytes, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """A shard's frame from its bytes; with `columns`, only those of them the file has."""
    if columns is None:
        return pl.read_parquet(io.BytesIO(data))
    present = pl.read_parquet_schema(io.BytesIO(data))
    return pl.read_parquet(io.BytesIO(data), columns=[c for c in columns if c in present])


def default_root() -> str:
    """$EAGLE_DATA_ROOT, else ./eagle-output (absolute, so every process agrees)."""
    root = settings.get(ROOT_ENV) or DEFAULT_ROOT
    return root if root.startswith("s3://") else str(Path(root).expanduser().resolve())


class ShardStore:
    """Reads and writes keys (relative paths) under a root that is a folder or `s3://bucket/prefix`."""

    def __init__(
        self,
        root: str | None = None,
        s3_client_factory: Callable[[], Any] | None = None,
        s3_link_factory: Callable[[str], Any] | None = None,
    ) -> None:
        """`s3_link_factory(endpoint_url)`: a client of the same settings for the endpoint links name."""
        self.root = (root or default_root()).rstrip("/")
        self._s3_factory = s3_client_factory
        self.files: LocalFiles | S3Files = (
            S3Files(self.root, s3_client_factory, s3_link_factory) if self.is_s3 else LocalFiles(self.root)
        )

    @property
    def is_s3(self) -> bool:
        return self.root.startswith("s3://")

    def check(self) -> None:
        """One line now, before anything is paid for, when the root cannot take shards: a folder root that
        is a file; an S3 bucket that is missing, refuses the credentials or cannot be reached."""
        self.files.check()

    # ---- one path scheme (eagle_data.layout) -----------------------------------------------------
    @staticmethod
    def shard_key(dataset: str, asset: str, partition: str) -> str:
        return layout.shard(dataset, asset, partition)

    def uri(self, key: str) -> str:
        return layout.under(self.root, key)

    def link(self, key: str) -> str:
        """A URL a browser opens: `file://` under a folder; on S3 a presigned GET URL, valid for 7 days (the
        longest S3 signatures allow; shorter if the credentials are temporary)."""
        return self.files.link(key)

    # ---- frames ----------------------------------------------------------------------------------
    def write_frame(self, key: str, frame: pl.DataFrame) -> str:
        return self.write_bytes(key, parquet_bytes(frame))

    def read_frame(self, key: str) -> pl.DataFrame:
        return self.frame_of(key, self.read_bytes(key))

    def frame_of(self, key: str, data: bytes) -> pl.DataFrame:
        """The parquet bytes already read from `key`; a CorruptFile (with its `mv` line) when torn or garbled."""
        return self._parquet(key, data)

    def write_shard(self, dataset: str, asset: str, partition: str, frame: pl.DataFrame) -> str:
        return self.write_frame(self.shard_key(dataset, asset, partition), frame)

    def read_shard(
        self, dataset: str, asset: str, partition: str, columns: Sequence[str] | None = None
    ) -> pl.DataFrame:
        """A shard; with `columns`, only those of them the file has (a reader that skips the token lists)."""
        key = self.shard_key(dataset, asset, partition)
        data = self.shard_bytes(dataset, asset, partition)
        return self._parquet(key, data, columns)

    def parse_shard(
        self, dataset: str, asset: str, partition: str, data: bytes, columns: Sequence[str] | None = None
    ) -> pl.DataFrame:
        """A shard's bytes, already read, as a frame; a CorruptFile (with its `mv` line) when torn or garbled."""
        return self._parquet(self.shard_key(dataset, asset, partition), data, columns)

    def _parquet(self, key: str, data: bytes, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The parquet file `data` stored at `key`; a CorruptFile naming it when it cannot be read."""
        try:
            return read_columns(data, columns)
        except (pl.exceptions.PolarsError, OSError) as exc:
            why = f"not a readable parquet file ({len(data)} bytes; {str(exc).splitlines()[0]})"
            raise self.corrupt(key, why) from None

    def corrupt(self, key: str, why: str) -> CorruptFile:
        """The one-line error for an unreadable stored file: which, why, and the command to move it aside."""
        move = self.files.move_command(self.uri(key), f"{self.uri(key)}.corrupt")
        return CorruptFile(
            f"{self.uri(key)} is {why}: move it aside with `{move}` and re-materialize the asset that writes it",
            key,
            why,
        )

    def move(self, key: str, new_key: str) -> None:
        """Rename `key` (on S3 a copy, then a delete)."""
        self.files.move(key, new_key)

    def move_aside(self, key: str) -> str:
        """Rename an unreadable `key` to `<key>.corrupt-<UTC time>` (never deleted: someone may want to look
        at it); readers then see it as a stray. Returns the new key."""
        aside = f"{key}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        self.move(key, aside)
        return aside

    def shard_bytes(self, dataset: str, asset: str, partition: str) -> bytes:
        """A shard's stored bytes (a parquet file), or a one-line error naming what to materialize."""
        key = self.shard_key(dataset, asset, partition)
        if not self.exists(key):
            raise StorageError(f"{self.uri(key)} does not exist: materialize {asset} partition {partition} first")
        return self.read_bytes(key)

    def shard_exists(self, dataset: str, asset: str, partition: str) -> bool:
        return self.exists(self.shard_key(dataset, asset, partition))

    # ---- bytes: the file system's own -------------------------------------------------------------
    def write_bytes(self, key: str, data: bytes) -> str:
        self.files.write(key, data)
        return self.uri(key)

    @property
    def can_append(self) -> bool:
        """Folders append in place; S3 has no append, so appenders write small part objects instead."""
        return self.files.can_append

    def append_bytes(self, key: str, data: bytes) -> str:
        """Append to a file in a folder root and fsync it: durable when this returns (folders only)."""
        self.files.append(key, data)
        return self.uri(key)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Write `data` at `key` only if nothing is there; False when something already is. Atomic against
        other processes and hosts (a hard link in a folder, a conditional PUT on S3)."""
        return self.files.create_exclusive(key, data)

    def staged(self, key: str, sync: bool = True) -> AbstractContextManager[Path]:
        """A local file to write `key` piece by piece, for outputs too big to hold in memory. On a clean
        exit it replaces `key` atomically (a rename in the folder, a multipart upload on S3); on an error
        it is removed and `key` keeps its old content. `sync=False` skips the fsyncs (about 8 ms a file
        here): still atomic for a killed process, not durable through a power cut; for many small files
        whose reader verifies them anyway."""
        return self.files.staged(key, sync)

    def read_bytes(self, key: str) -> bytes:
        return self.files.read(key)

    def missing(self, exc: BaseException) -> bool:
        """Whether `exc` (from `read_bytes`) means the key does not exist."""
        if isinstance(exc, FileNotFoundError):
            return True
        code = getattr(exc, "response", {}).get("Error", {}).get("Code")
        return code in ("404", "NoSuchKey", "NotFound")

    def exists(self, key: str) -> bool:
        return self.files.exists(key)

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder-like key), sorted."""
        return self.files.list(prefix)

    def download(self, key: str, path: Path) -> None:
        """Copy one key to a local file in chunks (never the whole object in memory)."""
        self.files.download(key, path)

    def local_file(self, key: str) -> AbstractContextManager[Path]:
        """A local path to one key for a reader that wants a file (a lazy parquet scan): the file itself
        under a folder, a temporary download from a bucket."""
        return self.files.local(key)

    def delete(self, key: str) -> None:
        self.files.delete(key)

    def s3_client(self) -> Any:
        """An S3 client with this store's settings (endpoint, credentials), e.g. to read a source on S3."""
        return (self._s3_factory or default_client)()
