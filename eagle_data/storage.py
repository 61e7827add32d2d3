"""Parquet shards on a local folder or S3, written atomically, under one path scheme.

Keys are built and parsed by `eagle_data.layout` (shards: `{root}/{dataset}/{asset}/{partition}.parquet`).
A reader never sees a half-written shard:
locally we write a temp file and `os.replace` it; on S3 a PUT is atomic by the protocol.
The Dagster layer writes every partition itself (no IO manager): Dagster's UPath IO managers refuse
single-run partition ranges, and dagster-polars breaks on polars 2.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data import layout, settings
from eagle_data.secrets import mask_url
from eagle_data.types import UserError

ROOT_ENV = "EAGLE_DATA_ROOT"
DEFAULT_ROOT = "eagle-output"
LINK_EXPIRES_S = 7 * 24 * 3600
FILE_MODE = 0o666  # what open() asks for; the process umask takes away the rest, as for any file it writes
RETRY_ENV = "EAGLE_DATA_STORAGE_RETRY_S"
DEFAULT_RETRY_S = 120.0  # how long an S3 call rides out an outage before the step fails
RETRY_PAUSE_S = (0.25, 5.0)  # first and longest pause between attempts (doubling)
TRANSIENT_CODES = ("SlowDown", "Throttling", "RequestTimeout", "InternalError", "ServiceUnavailable")
log = logging.getLogger(__name__)


class StorageError(UserError, RuntimeError):
    """A storage problem the user must fix; the message names the location and the fix."""


class CorruptFile(StorageError):
    """A stored file that cannot be read (a torn write, a disk fault): `key` names it, `why` says what is wrong."""

    def __init__(self, message: str, key: str, why: str) -> None:
        super().__init__(message)
        self.key, self.why = key, why


# what to say when the output root refuses a write, by errno (others quote the system's own words)
WRITE_FAILURES = {
    errno.EACCES: "is not writable (permission denied)",
    errno.EPERM: "is not writable (operation not permitted)",
    errno.EROFS: "is on a read-only file system",
    errno.ENOSPC: "is full (no space left on device)",
    errno.EDQUOT: "is over its disk quota",
    errno.ENOTDIR: "is not a folder (a file is in the way)",
}


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    """A frame as every shard and index block is stored: zstd parquet with column statistics."""
    buf = io.BytesIO()
    frame.write_parquet(buf, compression="zstd", statistics=True)
    return buf.getvalue()


def digest(data: bytes) -> str:
    """The sha256 of stored bytes: what a check judged, compared with what an export reads."""
    return hashlib.sha256(data).hexdigest()


def read_columns(data: bytes, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """A shard's frame from its bytes; with `columns`, only those of them the file has."""
    if columns is None:
        return pl.read_parquet(io.BytesIO(data))
    present = pl.read_parquet_schema(io.BytesIO(data))
    return pl.read_parquet(io.BytesIO(data), columns=[c for c in columns if c in present])


def write_failure(root: str, key: str, exc: OSError) -> StorageError:
    """One line for a write the output root refused: which root, why, and what to do."""
    why = WRITE_FAILURES.get(exc.errno or 0, f"refused the write ({exc.strerror or exc})")
    return StorageError(
        f"cannot write {key} under the output root {root}: it {why}; free space or make it writable, or point "
        f"{ROOT_ENV} at another folder"
    )


def default_root() -> str:
    """$EAGLE_DATA_ROOT, else ./eagle-output (absolute, so every process agrees)."""
    root = settings.get(ROOT_ENV) or DEFAULT_ROOT
    return root if root.startswith("s3://") else str(Path(root).expanduser().resolve())


class ShardStore:
    """Reads and writes keys (relative paths) under a root that is a folder or `s3://bucket/prefix`."""

    def __init__(self, root: str | None = None, s3_client_factory: Callable[[], Any] | None = None) -> None:
        self.root = (root or default_root()).rstrip("/")
        self._s3_factory = s3_client_factory
        self._s3: Any = None
        if self.is_s3:
            self.bucket, self.prefix = layout.s3_root(self.root)
            if not self.bucket:
                raise StorageError(f"{ROOT_ENV}={self.root!r} names no bucket; use s3://bucket/prefix")

    @property
    def is_s3(self) -> bool:
        return self.root.startswith("s3://")

    # ---- one path scheme (eagle_data.layout) -----------------------------------------------------
    @staticmethod
    def shard_key(dataset: str, asset: str, partition: str) -> str:
        return layout.shard(dataset, asset, partition)

    def uri(self, key: str) -> str:
        return layout.under(self.root, key)

    def link(self, key: str) -> str:
        """A URL a browser opens: `file://` under a folder; on S3 a presigned GET URL, valid for
        `LINK_EXPIRES_S` (7 days, the longest S3 signatures allow; shorter if the credentials are temporary)."""
        if not self.is_s3:
            return Path(self.uri(key)).as_uri()
        return self._client().generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._s3_key(key)}, ExpiresIn=LINK_EXPIRES_S
        )

    # ---- frames ----------------------------------------------------------------------------------
    def write_frame(self, key: str, frame: pl.DataFrame) -> str:
        return self.write_bytes(key, parquet_bytes(frame))

    def read_frame(self, key: str) -> pl.DataFrame:
        return self._parquet(key, self.read_bytes(key))

    def write_shard(self, dataset: str, asset: str, partition: str, frame: pl.DataFrame) -> str:
        return self.write_frame(self.shard_key(dataset, asset, partition), frame)

    def read_shard(
        self, dataset: str, asset: str, partition: str, columns: Sequence[str] | None = None
    ) -> pl.DataFrame:
        """A shard; with `columns`, only those of them the file has (a reader that skips the token lists)."""
        key = self.shard_key(dataset, asset, partition)
        data = self.shard_bytes(dataset, asset, partition)
        return self._parquet(key, data, columns)

    def _parquet(self, key: str, data: bytes, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The parquet file `data` stored at `key`; a CorruptFile naming it when it cannot be read."""
        try:
            return read_columns(data, columns)
        except (pl.exceptions.PolarsError, OSError) as exc:
            why = f"not a readable parquet file ({len(data)} bytes; {str(exc).splitlines()[0]})"
            raise self.corrupt(key, why) from None

    def corrupt(self, key: str, why: str) -> CorruptFile:
        """The one-line error for an unreadable stored file: which, why, and the command to move it aside."""
        return CorruptFile(
            f"{self.uri(key)} is {why}: move it aside with `{self._move_command(key)}` and re-materialize "
            "the asset that writes it",
            key,
            why,
        )

    def move_aside(self, key: str) -> str:
        """Rename an unreadable `key` to `<key>.corrupt-<UTC time>` (never deleted: someone may want to look
        at it); readers then see it as a stray. Returns the new key."""
        aside = f"{key}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        if self.is_s3:
            source = {"Bucket": self.bucket, "Key": self._s3_key(key)}
            self._client().copy_object(Bucket=self.bucket, Key=self._s3_key(aside), CopySource=source)
            self._client().delete_object(Bucket=self.bucket, Key=self._s3_key(key))
        else:
            os.replace(Path(self.root, key), Path(self.root, aside))
        return aside

    def _move_command(self, key: str) -> str:
        aside = f"{self.uri(key)}.corrupt"
        return f"aws s3 mv {self.uri(key)} {aside}" if self.is_s3 else f"mv {self.uri(key)} {aside}"

    def shard_bytes(self, dataset: str, asset: str, partition: str) -> bytes:
        """A shard's stored bytes (a parquet file), or a one-line error naming what to materialize."""
        key = self.shard_key(dataset, asset, partition)
        if not self.exists(key):
            raise StorageError(f"{self.uri(key)} does not exist: materialize {asset} partition {partition} first")
        return self.read_bytes(key)

    def shard_exists(self, dataset: str, asset: str, partition: str) -> bool:
        return self.exists(self.shard_key(dataset, asset, partition))

    # ---- bytes -----------------------------------------------------------------------------------
    def write_bytes(self, key: str, data: bytes) -> str:
        if self.is_s3:
            self._client().put_object(Bucket=self.bucket, Key=self._s3_key(key), Body=data)
        else:
            try:
                _write_atomically(Path(self.root, key), data)
            except OSError as exc:
                raise write_failure(self.root, key, exc) from None
        return self.uri(key)

    @property
    def can_append(self) -> bool:
        """Folders append in place; S3 has no append, so appenders write small part objects instead."""
        return not self.is_s3

    def append_bytes(self, key: str, data: bytes) -> str:
        """Append to a file in a folder root and fsync it: durable when this returns (folders only)."""
        if self.is_s3:
            raise StorageError(f"{self.root}: S3 objects cannot be appended to; write a new part object")
        path = Path(self.root, key)
        try:
            created = not path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if created:  # the new name must survive a crash too
                _fsync_dir(path.parent)
        except OSError as exc:
            raise write_failure(self.root, key, exc) from None
        return self.uri(key)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Write `data` at `key` only if nothing is there; False when something already is.

        Atomic against other processes and hosts. Folder: a complete temp file is hard-linked to the
        name, and link(2) fails when the name exists, as O_CREAT|O_EXCL does, without a reader ever
        seeing a half-written file. S3: a PUT with `If-None-Match: *` (412 when the key exists; a 409
        conflicting concurrent write also means someone else got there first).
        """
        if self.is_s3:
            from botocore.exceptions import ClientError

            try:
                self._client().put_object(Bucket=self.bucket, Key=self._s3_key(key), Body=data, IfNoneMatch="*")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return False
                raise
            return True
        path = Path(self.root, key)
        try:
            tmp = _write_temp(path, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise write_failure(self.root, key, exc) from None
        return True

    @contextmanager
    def staged(self, key: str, sync: bool = True) -> Iterator[Path]:
        """A local file to write `key` piece by piece, for outputs too big to hold in memory. On a clean
        exit it replaces `key` atomically (a rename in the folder, a multipart upload on S3); on an error
        it is removed and `key` keeps its old content. `sync=False` skips the fsyncs (about 8 ms a file
        here): still atomic for a killed process, not durable through a power cut; for many small files
        whose reader verifies them anyway."""
        local = not self.is_s3
        folder = Path(self.root, key).parent if local else Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = _new_temp(folder, Path(key).name)
        os.close(fd)
        try:
            yield tmp
            if local:
                try:
                    if sync:
                        with tmp.open("rb+") as fh:
                            os.fsync(fh.fileno())
                    os.replace(tmp, Path(self.root, key))
                    if sync:
                        _fsync_dir(folder)
                except OSError as exc:
                    raise write_failure(self.root, key, exc) from None
            else:
                self._client().upload_file(str(tmp), self.bucket, self._s3_key(key))
        finally:
            tmp.unlink(missing_ok=True)

    def read_bytes(self, key: str) -> bytes:
        if self.is_s3:
            return self._client().get_object(Bucket=self.bucket, Key=self._s3_key(key))["Body"].read()
        return Path(self.root, key).read_bytes()

    def missing(self, exc: BaseException) -> bool:
        """Whether `exc` (from `read_bytes`) means the key does not exist."""
        if isinstance(exc, FileNotFoundError):
            return True
        code = getattr(exc, "response", {}).get("Error", {}).get("Code")
        return code in ("404", "NoSuchKey", "NotFound")

    def exists(self, key: str) -> bool:
        if self.is_s3:
            from botocore.exceptions import ClientError

            try:
                self._client().head_object(Bucket=self.bucket, Key=self._s3_key(key))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise
            return True
        return Path(self.root, key).is_file()

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder-like key), sorted."""
        if self.is_s3:
            client, cut = self._client(), len(self.prefix) + 1 if self.prefix else 0

            def listing() -> list[str]:
                pages = client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self._s3_key(layout.join(prefix) + layout.SEP)
                )
                return sorted(obj["Key"][cut:] for page in pages for obj in page.get("Contents", []))

            return client.call(listing)
        base = Path(self.root, prefix)
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")
        )

    def download(self, key: str, path: Path) -> None:
        """Copy one key to a local file in chunks (never the whole object in memory)."""
        if self.is_s3:
            self._client().download_file(self.bucket, self._s3_key(key), str(path))
        else:
            shutil.copyfile(Path(self.root, key), path)

    def delete(self, key: str) -> None:
        if self.is_s3:
            self._client().delete_object(Bucket=self.bucket, Key=self._s3_key(key))
        else:
            Path(self.root, key).unlink(missing_ok=True)

    # ---- S3 plumbing -----------------------------------------------------------------------------
    def s3_client(self) -> Any:
        """An S3 client with this store's settings (endpoint, credentials), e.g. to read a source on S3."""
        if self._s3_factory is not None:
            return self._s3_factory()
        import boto3

        return boto3.client("s3")

    def _s3_key(self, key: str) -> str:
        return layout.under(self.prefix, key)

    def _client(self) -> Any:
        """The S3 client every store call goes through, its calls retried through an outage (`_Retrying`).
        The bucket check on first use is not retried: before anything is written there is nothing to keep."""
        if self._s3 is None:
            client = self.s3_client()
            self._check_bucket(client)
            self._s3 = _Retrying(client, retry_window_s())
        return self._s3

    def _check_bucket(self, client: Any) -> None:
        from botocore.exceptions import ClientError, EndpointConnectionError

        endpoint = mask_url(client.meta.endpoint_url or "")
        try:
            client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise StorageError(
                    f"S3 bucket {self.bucket!r} does not exist at {endpoint}: create it, or point {ROOT_ENV} "
                    "at an existing bucket"
                ) from None
            raise StorageError(f"S3 bucket {self.bucket!r} at {endpoint}: {code} ({exc}); check credentials") from None
        except EndpointConnectionError:
            raise StorageError(f"cannot reach the S3 endpoint {endpoint}: start it or fix AWS_ENDPOINT_URL") from None


def retry_window_s() -> float:
    """$EAGLE_DATA_STORAGE_RETRY_S, else 120 s: how long S3 calls are retried through an outage."""
    text = settings.get(RETRY_ENV)
    try:
        window = float(text) if text else DEFAULT_RETRY_S
    except ValueError:
        raise StorageError(f"{RETRY_ENV}={text!r} is not a number of seconds: give e.g. {RETRY_ENV}=120") from None
    if window < 0:
        raise StorageError(f"{RETRY_ENV} must be >= 0 seconds, got {text}")
    return window


def _transient(exc: BaseException) -> bool:
    """An S3 failure that waiting may cure: no connection, a timeout, a 5xx or a slow-down answer."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as NoConnection

    if isinstance(exc, (HTTPClientError, NoConnection)):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or exc.response.get("Error", {}).get("Code") in TRANSIENT_CODES
    return False


class _Retrying:
    """An S3 client whose calls ride out an outage: a transient failure is retried with doubling pauses for
    up to `window_s`, then becomes one StorageError line. Meanwhile the caller waits, and what it holds
    (answered turns not yet written) stays in memory: nothing is lost, nothing is paid for twice."""

    def __init__(self, client: Any, window_s: float) -> None:
        self._client, self._window_s = client, window_s
        self.meta = client.meta

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name == "get_paginator" or not callable(attr):
            return attr  # a paginator calls as it is read: `call` wraps the whole read
        return lambda *args, **kwargs: self.call(lambda: attr(*args, **kwargs))

    def call(self, attempt: Callable[[], Any]) -> Any:
        deadline, pause, said = time.monotonic() + self._window_s, RETRY_PAUSE_S[0], False
        while True:
            try:
                return attempt()
            except Exception as exc:
                if not _transient(exc):
                    raise
                endpoint = mask_url(self.meta.endpoint_url or "")
                if time.monotonic() + pause > deadline:
                    raise StorageError(
                        f"S3 at {endpoint} still failing after {self._window_s:g} s of retries "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0]}): bring it back and re-run (what was "
                        f"written stays), or set {RETRY_ENV} to wait longer"
                    ) from None
                if not said:
                    said = True
                    log.warning("S3 at %s: %s; retrying for up to %g s", endpoint, type(exc).__name__, self._window_s)
                time.sleep(pause)
                pause = min(pause * 2, RETRY_PAUSE_S[1])


def _write_temp(path: Path, data: bytes) -> Path:
    """A complete, fsync'd temp file beside `path`, to be renamed or linked into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _new_temp(folder: Path, name: str) -> tuple[int, Path]:
    """A new temporary file `.{name}.{random}.tmp` in `folder`, open for writing. Made like any file (FILE_MODE
    less the umask, which the kernel applies), where mkstemp makes 0600 files that would need a chmod and a
    read of the umask: a tenth of a millisecond per file, which counts for captures of many small files."""
    while True:
        path = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE), path
        except FileExistsError:
            continue


def _write_atomically(path: Path, data: bytes) -> None:
    """Write a temp file beside `path`, fsync it and rename it into place: readers see all or nothing."""
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
