"""Links on the asset pages that open in a browser: presigned on S3, and under a folder root on the project's
read-only files server (`python -m eagle_data.files_server`), started here for real on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from eagle_data import layout
from eagle_data.defs.metadata import SHARD_LINK, URI, shard_locations
from eagle_data.defs.resources import S3ClientResource, StorageResource
from eagle_data.files_server import FILES_URL_ENV, browser_link, make_server
from eagle_data.standins.local import free_port, stop_process_group
from eagle_data.storage import ShardStore, StorageError
from eagle_data.storage.s3 import LINK_URL_ENV

REPORT = b"<html><a href='00000.html'>shard 00000</a></html>"


@pytest.fixture
def files_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ShardStore, str]]:
    """A folder root served on 127.0.0.1, and EAGLE_DATA_FILES_URL naming it, as README starts it."""
    store = ShardStore(str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    server: ThreadingHTTPServer = make_server(store.root, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv(FILES_URL_ENV, url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield store, url
    finally:
        server.shutdown()
        server.server_close()


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
    assert fetch(f"{url}/b7_sharegpt/")[0] == 404  # no listing
    for method in ("PUT", "POST", "DELETE"):
        assert fetch(f"{url}/b7_sharegpt/x.txt", method)[0] == 501
    assert store.read_bytes("b7_sharegpt/x.txt") == b"inside"


def test_without_a_files_server_a_folder_root_has_no_link_and_s3_is_presigned(
    store: ShardStore, monkeypatch: pytest.MonkeyPatch
):
    """A file:// link would not open from Dagster's http:// page, so a folder root without the server gets none."""
    monkeypatch.delenv(FILES_URL_ENV, raising=False)
    key = layout.quality_index("b7_sharegpt")
    store.write_bytes(key, REPORT)
    link = browser_link(store, key)
    if not store.is_s3:
        assert link is None
        return
    assert link is not None and "X-Amz-Algorithm=AWS4-HMAC-SHA256" in link  # SigV4, which every bucket takes
    assert fetch(link) == (200, REPORT)


def test_the_module_serves_the_root_in_one_process(tmp_path: Path):
    """`python -m eagle_data.files_server` as README starts it: listens where EAGLE_DATA_FILES_URL says."""
    (tmp_path / "b7_sharegpt").mkdir(parents=True)
    (tmp_path / "b7_sharegpt" / "x.txt").write_text("inside")
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "EAGLE_DATA_ROOT": str(tmp_path), FILES_URL_ENV: url}
    proc = subprocess.Popen([sys.executable, "-m", "eagle_data.files_server"], env=env, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        assert proc.stderr is not None and f"serving {tmp_path} read-only on {url}/" in proc.stderr.readline()
        assert fetch(f"{url}/b7_sharegpt/x.txt") == (200, b"inside")
    finally:
        stop_process_group(proc)


def test_a_bad_files_url_or_an_s3_root_is_one_line(tmp_path: Path):
    env = {**os.environ, "EAGLE_DATA_ROOT": str(tmp_path), FILES_URL_ENV: "ftp://x"}
    out = subprocess.run([sys.executable, "-m", "eagle_data.files_server"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"{FILES_URL_ENV}='ftp://x': use http://HOST:PORT, e.g. http://127.0.0.1:3001"
    ]
    env["EAGLE_DATA_ROOT"] = "s3://bucket/runs"
    out = subprocess.run([sys.executable, "-m", "eagle_data.files_server"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 1 and "is on S3: its links are presigned" in out.stderr and "Traceback" not in out.stderr


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
