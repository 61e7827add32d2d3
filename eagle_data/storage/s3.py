"""An S3 bucket (prefix) as the shard store's file system: PUTs are atomic by the protocol, an exclusive
create is a conditional PUT, and every call rides out an outage (`_Retrying`)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle_data import layout, settings
from eagle_data.secrets import mask_url
from eagle_data.storage.errors import ROOT_ENV, StorageError
from eagle_data.storage.local import _new_temp

LINK_EXPIRES_S = 7 * 24 * 3600
# The endpoint the files server's signed redirects name when browsers reach the store at another address than
# this process (docker's MinIO: `http://minio:9000` inside compose, `http://127.0.0.1:9000` on the host). A
# SigV4 signature covers the host, so the link is signed for that address, not rewritten after signing.
LINK_URL_ENV = "EAGLE_DATA_S3_LINK_URL"
RETRY_ENV = "EAGLE_DATA_STORAGE_RETRY_S"
DEFAULT_RETRY_S = 120.0  # how long an S3 call rides out an outage before the step fails
RETRY_PAUSE_S = (0.25, 5.0)  # first and longest pause between attempts (doubling)
TRANSIENT_CODES = ("SlowDown", "Throttling", "RequestTimeout", "InternalError", "ServiceUnavailable")
MISSING_CODES = ("404", "NoSuchKey", "NotFound")
log = logging.getLogger(__name__)


def default_client(endpoint_url: str | None = None) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url)


def link_endpoint() -> str | None:
    """$EAGLE_DATA_S3_LINK_URL (an http(s) URL), else None: links name the endpoint the store calls."""
    url = settings.get(LINK_URL_ENV).rstrip("/")
    if url and not url.startswith(("http://", "https://")):
        raise StorageError(
            f"{LINK_URL_ENV}={url!r} is not an http(s) URL: give e.g. {LINK_URL_ENV}=http://127.0.0.1:9000"
        )
    return url or None


class S3Files:
    """Keys as objects under `s3://bucket/prefix`, through one client built on first use (the bucket checked
    then, before anything is written)."""

    can_append = False  # S3 has no append: appenders write small part objects instead

    def __init__(
        self, root: str, client_factory: Callable[[], Any] | None, link_factory: Callable[[str], Any] | None = None
    ) -> None:
        self.root = root
        self.bucket, self.prefix = layout.s3_root(root)
        if not self.bucket:
            raise StorageError(f"{ROOT_ENV}={root!r} names no bucket; use s3://bucket/prefix")
        self.client_factory = client_factory or default_client
        self.link_factory = link_factory or default_client  # a client for another endpoint, same settings
        self._client: Any = None
        self._link: Any = None

    def check(self) -> None:
        self.client()

    def client(self) -> Any:
        """The client every call goes through, retried through an outage; the bucket is checked on its first
        use, through the same retries: that first call may be the shard IO manager's, after an hour of paid
        replies (an outage there lost the run, issue 43)."""
        if self._client is None:
            client = _Retrying(presign_with_sigv4(self.client_factory()), retry_window_s())
            check_bucket(client, self.bucket)
            self._client = client
        return self._client

    def key(self, key: str) -> str:
        return layout.under(self.prefix, key)

    def link(self, key: str, expires_s: int = LINK_EXPIRES_S) -> str:
        """A presigned GET URL, valid for `expires_s` (at most 7 days, the longest S3 signatures allow), for the
        endpoint a browser reaches (LINK_URL_ENV; signing makes no request). Never stored: it carries the
        credentials' id and a session token's value (the files server signs one per request instead)."""
        client, public = self.client(), link_endpoint()
        if public and public != (client.meta.endpoint_url or "").rstrip("/"):
            client = self._link_client(public)
        params = {"Bucket": self.bucket, "Key": self.key(key)}
        return client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s)

    def _link_client(self, endpoint_url: str) -> Any:
        if self._link is None or self._link.meta.endpoint_url != endpoint_url:
            self._link = presign_with_sigv4(self.link_factory(endpoint_url))
        return self._link

    def move_command(self, uri: str, aside: str) -> str:
        return f"aws s3 mv {uri} {aside}"

    def write(self, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=self.key(key), Body=data)

    def append(self, key: str, data: bytes) -> None:
        raise StorageError(f"{self.root}: S3 objects cannot be appended to; write a new part object")

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """A PUT with `If-None-Match: *` (412 when the key exists; a 409 conflicting concurrent write also
        means someone else got there first)."""
        from botocore.exceptions import ClientError

        try:
            self.client().put_object(Bucket=self.bucket, Key=self.key(key), Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True

    @contextmanager
    def staged(self, key: str, sync: bool) -> Iterator[Path]:
        """A local temp file, uploaded (multipart) on a clean exit."""
        folder = Path(tempfile.gettempdir())
        fd, tmp = _new_temp(folder, Path(key).name)
        os.close(fd)
        try:
            yield tmp
            self.client().upload_file(str(tmp), self.bucket, self.key(key))
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=self.key(key))["Body"].read()

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client().head_object(Bucket=self.bucket, Key=self.key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in MISSING_CODES:
                return False
            raise
        return True

    def list(self, prefix: str) -> list[str]:
        client, cut = self.client(), len(self.prefix) + 1 if self.prefix else 0

        def listing() -> list[str]:
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.key(layout.join(prefix) + layout.SEP)
            )
            return sorted(obj["Key"][cut:] for page in pages for obj in page.get("Contents", []))

        return client.call(listing)

    def download(self, key: str, path: Path) -> None:
        self.client().download_file(self.bucket, self.key(key), str(path))

    @contextmanager
    def local(self, key: str) -> Iterator[Path]:
        """A temporary download of the object, removed on exit."""
        with tempfile.TemporaryDirectory(prefix="eagle-local-") as folder:
            path = Path(folder, Path(key).name)
            self.download(key, path)
            yield path

    def move(self, key: str, new_key: str) -> None:
        source = {"Bucket": self.bucket, "Key": self.key(key)}
        self.client().copy_object(Bucket=self.bucket, Key=self.key(new_key), CopySource=source)
        self.client().delete_object(Bucket=self.bucket, Key=self.key(key))

    def delete(self, key: str) -> None:
        self.client().delete_object(Bucket=self.bucket, Key=self.key(key))


def presign_with_sigv4(client: Any) -> Any:
    """Presign GETs with SigV4, as every other call is signed: botocore presigns with SigV2 by default where
    S3 still takes it (`_default_s3_presign_to_sigv2`), a deprecated scheme that signs no host. A handler of
    botocore's `choose-signer` event, as dagster-aws's unsigned session uses (docs/facts.md, "Presigned
    links")."""

    def sigv4(signature_version: str, **_: Any) -> str | None:
        return "s3v4-query" if signature_version.endswith("-query") else None

    client.meta.events.register("choose-signer.s3.*", sigv4)  # after an unsigned session's own
    return client


def check_bucket(client: Any, bucket: str) -> None:
    """One line when the bucket is missing or the credentials are refused; an unreachable endpoint is retried
    by `client` (`_Retrying`), then is its line."""
    from botocore.exceptions import ClientError

    endpoint = mask_url(client.meta.endpoint_url or "")
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise StorageError(
                f"S3 bucket {bucket!r} does not exist at {endpoint}: create it, or point {ROOT_ENV} "
                "at an existing bucket"
            ) from None
        raise StorageError(f"S3 bucket {bucket!r} at {endpoint}: {code} ({exc}); check credentials") from None


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


def _unreachable(exc: BaseException) -> bool:
    """No connection at all: the endpoint is down or its address is wrong."""
    from botocore.exceptions import EndpointConnectionError

    return isinstance(exc, EndpointConnectionError)


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
                    fix = "start it or fix AWS_ENDPOINT_URL" if _unreachable(exc) else "bring it back"
                    raise StorageError(
                        f"S3 at {endpoint} still failing after {self._window_s:g} s of retries "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0]}): {fix} and re-run (what was "
                        f"written stays), or set {RETRY_ENV} to wait longer"
                    ) from None
                if not said:
                    said = True
                    log.warning("S3 at %s: %s; retrying for up to %g s", endpoint, type(exc).__name__, self._window_s)
                time.sleep(pause)
                pause = min(pause * 2, RETRY_PAUSE_S[1])
