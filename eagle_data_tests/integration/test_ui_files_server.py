"""Links on the asset pages that open in a browser, through the project's read-only files server (`python -m
eagle_data.files_server`, aiohttp), started here for real on a free port: a folder root's files, and on S3 a
redirect to a GET signed on request."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from eagle_data import layout
from eagle_data.defs.metadata import SHARD_LINK, URI, shard_locations
from eagle_data.defs.resources import S3ClientResource, StorageResource
from eagle_data.files_server import FILES_URL_ENV, browser_link
from eagle_data.standins.local import free_port, stop_process_group
from eagle_data.storage import ShardStore, StorageError
from eagle_data.storage.s3 import LINK_URL_ENV

REPORT = b"<html><a href='00000.html'>shard 00000</a></html>"


class Served:
    """A files server process: its URL, and its stderr once it stopped (`lines`)."""

    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url, self.lines = proc, url, list[str]()


@contextmanager
def files_server_process(root: str, *args: str, **env: str) -> Iterator[Served]:
    """`python -m eagle_data.files_server ARGS` on `root`, as README starts it, on a free port; yields once it
    said it listens."""
    url = f"http://127.0.0.1:{free_port()}"
    environ = {**os.environ, "EAGLE_DATA_ROOT": root, FILES_URL_ENV: url, **env}
    proc = subprocess.Popen([sys.executable, "-m", "eagle_data.files_server", *args], env=environ,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    served = Served(proc, url)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert f"read-only on {url}/" in first, first + proc.stderr.read()
        yield served
    finally:
        stop_process_group(proc)
        assert proc.stderr is not None
        served.lines = proc.stderr.read().splitlines()


@pytest.fixture
def files_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ShardStore, str]]:
    """A folder root served on 127.0.0.1, and EAGLE_DATA_FILES_URL naming it, as README starts it."""
    store = ShardStore(str(tmp_path / "out"))
    with files_server_process(store.root) as served:
        monkeypatch.setenv(FILES_URL_ENV, served.url)
        yield store, served.url


def fetch(url: str, method: str = "GET") -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_a_report_link_opens_and_its_shard_link_follows(files_server: tuple[ShardStore, str]):
    store, url = files_server
    store.write_bytes(layout.quality_index("b7_sharegpt"), REPORT)
    store.write_bytes(layout.quality_page("b7_sharegpt", "00000"), b"<html>shard page</html>")
    link = browser_link(store, layout.quality_index("b7_sharegpt"))
    assert link is not None and link.startswith(f"{url}/b7_sharegpt/")
    assert fetch(link) == (200, REPORT)
    assert fetch(urllib.parse.urljoin(link, "00000.html")) == (200, b"<html>shard page</html>")  # relative links


def test_the_files_server_only_reads_files_under_its_root(files_server: tuple[ShardStore, str], tmp_path: Path):
    store, url = files_server
    (tmp_path / "secret.txt").write_text("outside the root")
    store.write_bytes("b7_sharegpt/x.txt", b"inside")
    assert fetch(f"{url}/b7_sharegpt/x.txt", "HEAD")[0] == 200
    assert fetch(f"{url}/../secret.txt")[0] == 404 and fetch(f"{url}/%2e%2e/secret.txt")[0] == 404
    assert fetch(f"{url}/b7_sharegpt/")[0] == 403  # no listing
    for method in ("PUT", "POST", "DELETE"):
        assert fetch(f"{url}/b7_sharegpt/x.txt", method)[0] == 405
    assert store.read_bytes("b7_sharegpt/x.txt") == b"inside"


def test_without_a_files_server_there_is_no_link(store: ShardStore, monkeypatch: pytest.MonkeyPatch):
    """A file:// link would not open from Dagster's http:// page, and a presigned one would store a signature (and a
    session token) in the event log: without the server a file has its path or s3:// URI only."""
    monkeypatch.delenv(FILES_URL_ENV, raising=False)
    key = layout.quality_index("b7_sharegpt")
    store.write_bytes(key, REPORT)
    assert browser_link(store, key) is None


def test_a_bad_files_url_or_a_root_that_is_a_file_is_one_line(tmp_path: Path):
    env = {**os.environ, "EAGLE_DATA_ROOT": str(tmp_path), FILES_URL_ENV: "ftp://x"}
    out = subprocess.run([sys.executable, "-m", "eagle_data.files_server"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"{FILES_URL_ENV}='ftp://x': use http://HOST:PORT, e.g. http://127.0.0.1:3001"
    ]
    (tmp_path / "file").write_text("not a folder")
    env.update(EAGLE_DATA_ROOT=str(tmp_path / "file"), **{FILES_URL_ENV: f"http://127.0.0.1:{free_port()}"})
    out = subprocess.run([sys.executable, "-m", "eagle_data.files_server"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"cannot serve the output root {tmp_path / 'file'}: ")


def test_a_shard_is_a_path_and_a_link_that_opens(files_server: tuple[ShardStore, str]):
    store, url = files_server
    key = store.shard_key("b7_sharegpt", "b7_sharegpt_validated", "00000")
    store.write_bytes(key, b"PAR1 shard bytes")
    found = shard_locations(store, "b7_sharegpt", "b7_sharegpt_validated", "00000")
    assert found[URI].value == store.uri(key) and found[SHARD_LINK].value == f"{url}/{key}"
    assert fetch(str(found[SHARD_LINK].value)) == (200, b"PAR1 shard bytes")


def test_s3_links_are_signed_for_the_address_a_browser_reaches(
    s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
):
    """Inside docker the store is `http://minio:9000`, which the host's browser cannot resolve: with
    EAGLE_DATA_S3_LINK_URL the link is signed for that address (a signature covers the host), while every
    call of the store still goes to its own endpoint."""
    port = urlsplit(s3_endpoint).port
    store = StorageResource(root=f"s3://{s3_bucket}/runs", s3=S3ClientResource(endpoint_url=s3_endpoint)).store()
    key = layout.quality_index("b7_sharegpt")
    store.write_bytes(key, REPORT)
    monkeypatch.setenv(LINK_URL_ENV, f"http://localhost:{port}/")
    link, direct = signed_twice(store, key, f"http://localhost:{port}")
    assert link.startswith(f"http://localhost:{port}/{s3_bucket}/runs/") and "X-Amz-Signature=" in link
    assert link == direct  # moto checks no signature: this is boto3's SigV4 for that host
    assert fetch(link) == (200, REPORT)
    assert store.files.client().meta.endpoint_url == s3_endpoint  # the store itself still calls 127.0.0.1
    monkeypatch.delenv(LINK_URL_ENV)
    assert store.link(key).startswith(f"{s3_endpoint}/")
    unsigned = S3ClientResource(endpoint_url=s3_endpoint, use_unsigned_session=True)
    public = StorageResource(root=f"s3://{s3_bucket}/runs", s3=unsigned).store().link(key)
    assert "Signature" not in public and "X-Amz-" not in public  # a public bucket's link stays unsigned
    monkeypatch.setenv(LINK_URL_ENV, "localhost:9000")
    with pytest.raises(StorageError, match=f"^{LINK_URL_ENV}='localhost:9000' is not an http"):
        store.link(key)


def signed_twice(store: ShardStore, key: str, endpoint: str) -> tuple[str, str]:
    """The store's link, and boto3's own for `endpoint`, signed in the same second (X-Amz-Date)."""
    import boto3
    from botocore.config import Config

    direct_client = boto3.client("s3", endpoint_url=endpoint, config=Config(signature_version="s3v4"))
    params = {"Bucket": store.files.bucket, "Key": store.files.key(key)}
    for _ in range(3):
        link = store.link(key)
        direct = direct_client.generate_presigned_url("get_object", Params=params, ExpiresIn=7 * 24 * 3600)
        if parse_qs(urlsplit(link).query)["X-Amz-Date"] == parse_qs(urlsplit(direct).query)["X-Amz-Date"]:
            break
    return link, direct


def test_on_s3_the_server_redirects_to_a_get_signed_on_request(s3_endpoint: str, s3_bucket: str):
    """What the asset pages link on S3: the files server, which signs a GET when asked (for the address a browser
    reaches) and redirects there, so no signed URL is ever stored; HEAD is answered the same way."""
    store = ShardStore(f"s3://{s3_bucket}/runs", s3_client_factory=lambda: _client(s3_endpoint))
    key = layout.quality_index("b7_sharegpt")
    store.write_bytes(key, REPORT)
    port = urlsplit(s3_endpoint).port
    env = {"AWS_ENDPOINT_URL": s3_endpoint, LINK_URL_ENV: f"http://localhost:{port}"}
    with files_server_process(store.root, **env) as served:
        for method in ("GET", "HEAD"):
            status, location = unfollowed(f"{served.url}/{key}", method)
            assert status == 302 and location.startswith(f"http://localhost:{port}/{s3_bucket}/runs/{key}?")
            query = parse_qs(urlsplit(location).query)
            assert "X-Amz-Signature" in query and int(query["X-Amz-Expires"][0]) <= 3600
        assert fetch(f"{served.url}/{key}") == (200, REPORT)  # followed: the object itself
        assert unfollowed(f"{served.url}/b7_sharegpt/../secret", "GET")[0] == 404  # no key the layout never writes


def _client(endpoint: str) -> object:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def unfollowed(url: str, method: str) -> tuple[int, str]:
    """Status and Location of one request, redirects not followed."""
    import http.client

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.request(method, parts.path)
        response = connection.getresponse()
        return response.status, response.getheader("Location") or ""
    finally:
        connection.close()
