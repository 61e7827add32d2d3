"""An S3 outage (moto's server behind a TCP proxy whose link is cut) is ridden out, within a set window."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import boto3
import pytest

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.storage import RETRY_ENV, ShardStore, StorageError
from eagle_data_tests.servers.cut_proxy import CutProxy
from eagle_data_tests.servers.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests

DS = "b7_sharegpt"


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[CutProxy]:
    proxy = CutProxy(urlsplit(s3_endpoint).port or 0)
    yield proxy
    proxy.close()


def _store(proxy: CutProxy, bucket: str) -> ShardStore:
    url = f"http://127.0.0.1:{proxy.port}"
    # botocore's own retries off: the store's retry window is what is under test
    config = {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 2}
    from botocore.config import Config

    return ShardStore(
        f"s3://{bucket}/out", s3_client_factory=lambda: boto3.client("s3", endpoint_url=url, config=Config(**config))
    )


def test_a_write_during_a_short_outage_waits_and_lands(
    proxy: CutProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRY_ENV, "10")
    store = _store(proxy, s3_bucket)
    store.write_bytes("a/one.bin", b"before")
    started = time.monotonic()
    proxy.cut(2.0)
    store.write_bytes("a/two.bin", b"during")
    assert time.monotonic() - started >= 1.5 and store.read_bytes("a/two.bin") == b"during"
    assert store.list("a") == ["a/one.bin", "a/two.bin"]


def test_an_outage_longer_than_the_window_is_one_line_naming_the_setting(
    proxy: CutProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRY_ENV, "1")
    store = _store(proxy, s3_bucket)
    store.write_bytes("a/one.bin", b"before")
    proxy.cut(4.0)
    one_line = f"still failing after 1 s of retries .*set {RETRY_ENV} to wait longer"
    with pytest.raises(StorageError, match=one_line) as err:
        store.read_bytes("a/one.bin")
    assert "\n" not in str(err.value)


def test_a_run_rides_out_an_s3_outage_and_pays_for_nothing_twice(
    server: FakeOpenAI, proxy: CutProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRY_ENV, "20")
    server.faults = Faults(latency_s=0.05)
    shards = prompt_shards(4, 10)
    store = _store(proxy, s3_bucket)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=5.0)
    settings = RunnerSettings(max_in_flight=2, initial_in_flight=2, min_in_flight=1, progress_bar=False, lease_ttl_s=30)
    cutter = threading.Timer(0.5, lambda: proxy.cut(4.0))  # the outage spans shards being written
    cutter.start()
    run_generation(engine, spec_for_tests(), shards, store, settings=settings, log=lambda _: None)
    cutter.join()
    assert all(set(store.read_shard(DS, DS, p)["status"]) == {"ok"} for p in shards)
    assert len(server.answered) == 40 and max(server.answered.values()) == 1
