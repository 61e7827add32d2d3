"""An S3 outage (moto's server behind a TCP proxy whose link is cut) is ridden out, within a set window."""

from __future__ import annotations

import threading
import time

import pytest

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.standins.cut_proxy import CutProxy
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import RETRY_ENV, StorageError
from eagle_data_tests.conftest import store_behind

DS = "b7_sharegpt"


def test_a_write_during_a_short_outage_waits_and_lands(
    s3_proxy: CutProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRY_ENV, "10")
    store = store_behind(s3_proxy, s3_bucket)
    store.write_bytes("a/one.bin", b"before")
    started = time.monotonic()
    s3_proxy.cut(2.0)
    store.write_bytes("a/two.bin", b"during")
    assert time.monotonic() - started >= 1.5 and store.read_bytes("a/two.bin") == b"during"
    assert store.list("a") == ["a/one.bin", "a/two.bin"]


def test_an_outage_longer_than_the_window_is_one_line_naming_the_setting(
    s3_proxy: CutProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRY_ENV, "1")
    store = store_behind(s3_proxy, s3_bucket)
    store.write_bytes("a/one.bin", b"before")
    s3_proxy.cut(4.0)
    one_line = f"still failing after 1 s of retries .*set {RETRY_ENV} to wait longer"
    with pytest.raises(StorageError, match=one_line) as err:
        store.read_bytes("a/one.bin")
    assert "\n" not in str(err.value)


def test_a_run_rides_out_an_s3_outage_and_pays_for_nothing_twice(
    server: FakeOpenAI, s3_proxy: CutProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRY_ENV, "20")
    server.faults = Faults(latency_s=0.05)
    shards = prompt_shards(4, 10)
    store = store_behind(s3_proxy, s3_bucket)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=5.0)
    settings = RunnerSettings(max_in_flight=2, initial_in_flight=2, min_in_flight=1, progress_bar=False, lease_ttl_s=30)
    cutter = threading.Timer(0.5, lambda: s3_proxy.cut(4.0))  # the outage spans shards being written
    cutter.start()
    run_generation(engine, spec_for_tests(), shards, store, settings=settings, log=lambda _: None)
    cutter.join()
    assert all(set(store.read_shard(DS, DS, p)["status"]) == {"ok"} for p in shards)
    assert len(server.answered) == 40 and max(server.answered.values()) == 1
