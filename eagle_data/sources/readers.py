"""Where a dataset's rows come from (the hub, a local or S3 parquet/JSONL file, the bundled sample), what
identifies that content, and its rows as a stream."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.sources.prompts import SourceError
from eagle_data.storage import file_digest
from eagle_data.storage.s3 import default_client

BATCH_ROWS = 2048  # source rows per batch read from a parquet file


def source_location(spec: DatasetSpec, override: str | None = None) -> str:
    """Where the rows come from: an explicit path, the bundled sample, a catalog path, or the hub."""
    if override:
        return override
    if spec.source == "sample":
        return str(spec.sample_path)
    if spec.source:
        return spec.source
    if not spec.hub_id:
        raise SourceError(f"dataset {spec.name!r} has neither hub_id nor source in the catalog; set one")
    return f"hf://datasets/{spec.hub_id}@~parquet/{spec.config or 'default'}/{spec.split}/*.parquet"


@dataclass(frozen=True)
class Source:
    """One source location and how to read it: its content identity, and its rows as a stream."""

    spec: DatasetSpec
    location: str
    s3_client: Callable[[], Any] = default_client  # for s3:// sources: the store's own client (its settings)

    def identity(self) -> dict[str, Any] | None:
        """What identifies the content: a local file's size, mtime and SHA-256 (the hash only when asked
        by `same_content`), an S3 object's ETag, a hub dataset's revision; None when it cannot be told."""
        if self.location.startswith("hf://"):
            revision = _hub_revision(self.spec.hub_id or "")
            return {"revision": revision} if revision else None
        if self.location.startswith("s3://"):
            head = self._s3_head()
            return {"etag": head["ETag"], "size": head["ContentLength"]}
        path = self._local_path()
        stat = path.stat()
        times = {"mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}
        return {"size": stat.st_size, **times, "sha256": file_digest(path)}

    def same_content(self, saved: dict[str, Any] | None) -> bool:
        """Whether the source still holds the content `saved` was taken from. A local file whose size, mtime
        and ctime are unchanged is not re-hashed (so a big file costs a stat); any other same-size file is
        compared by its SHA-256. The ctime is what makes this safe: the kernel sets it on every write and
        no call sets it back, so an edit that restores the mtime (`touch -d`, `cp -p`) is still hashed. A
        source that cannot be looked at (a hub revision offline, a local file since removed, e.g. on another
        machine sharing an S3 root) counts as unchanged: the saved index stands, and nothing else needs it."""
        if self.location.startswith(("hf://", "s3://")):
            now = self.identity()
            return now is None or now == saved
        if saved is None:
            return False
        path = Path(self.location).expanduser()
        if not path.is_file():
            return True
        stat = path.stat()
        quick = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if quick == (saved.get("size"), saved.get("mtime_ns"), saved.get("ctime_ns")):
            return True
        return stat.st_size == saved.get("size") and file_digest(path) == saved.get("sha256")

    def rows(self) -> Iterator[dict[str, Any]]:
        """Raw source rows as dicts, streamed. A JSONL line that is not JSON, not an object or not UTF-8
        is a counted skip (`malformed_row`, `bad_encoding`), never a reason to reject the file; so is a
        row whose text holds a lone surrogate (`bad_encoding`, from `normalize`)."""
        if self.location.startswith("hf://"):
            yield from self._parquet_rows(self.location, self.location)
        elif self.location.startswith("s3://"):
            with tempfile.TemporaryDirectory(prefix="eagle-source-") as tmp:
                local = Path(tmp, Path(self.location).name)
                bucket, key = layout.s3_root(self.location)
                self._client().download_file(bucket, key, str(local))
                yield from self._file_rows(local)
        else:
            yield from self._file_rows(self._local_path())

    # ---- readers ---------------------------------------------------------------------------------
    def _file_rows(self, path: Path) -> Iterator[dict[str, Any]]:
        if path.suffix == ".parquet":
            yield from self._parquet_rows(str(path), self.location)
        elif path.suffix in (".jsonl", ".json"):
            yield from _jsonl_rows(path)
        else:
            raise SourceError(f"dataset {self.spec.name!r}: {self.location} is neither .parquet nor .jsonl")

    def _parquet_rows(self, path: str, shown: str) -> Iterator[dict[str, Any]]:
        try:
            for batch in pl.scan_parquet(path).collect_batches(chunk_size=BATCH_ROWS):
                yield from batch.iter_rows(named=True)
        except (pl.exceptions.PolarsError, OSError) as exc:
            if shown.startswith("hf://"):
                raise SourceError(
                    f"dataset {self.spec.name!r}: cannot read {shown} ({type(exc).__name__}); check the network "
                    "and hub id, or pass a local file (source_path) — e.g. EAGLE_DATA_PROFILE=demo uses the "
                    "bundled sample"
                ) from None
            size = Path(path).stat().st_size if Path(path).is_file() else 0
            raise SourceError(
                f"dataset {self.spec.name!r}: {shown} ({size} bytes) is not a complete parquet file "
                f"({_first_line(exc)}); re-download or re-export it"
            ) from None

    def _local_path(self) -> Path:
        path = Path(self.location).expanduser()
        if not path.is_file():
            raise SourceError(
                f"dataset {self.spec.name!r}: source file {path} not found; fix the path (catalog `source` or the "
                "prompts asset's source_path config) or download the dataset there"
            )
        return path

    def _client(self) -> Any:
        return self.s3_client()

    def _s3_head(self) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = layout.s3_root(self.location)
        try:
            return self._client().head_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise SourceError(
                f"dataset {self.spec.name!r}: cannot read source object {self.location} ({_first_line(exc)}); "
                "fix the location or the S3 credentials and endpoint"
            ) from None


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for raw in fh:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield {"__bad_encoding__": True}
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = {"__malformed__": True}
            yield row if isinstance(row, dict) else {"__malformed__": True}


def _hub_revision(hub_id: str) -> str | None:
    """The commit of the hub dataset's parquet conversion, or None offline (then the saved index stands)."""
    try:
        from huggingface_hub import HfApi

        refs = HfApi().list_repo_refs(hub_id, repo_type="dataset")
        return next((ref.target_commit for ref in refs.converts if ref.name == "parquet"), None)
    except Exception:  # offline, unknown id, rate limit: the content cannot be told, which is not an error here
        return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
