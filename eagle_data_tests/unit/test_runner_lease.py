"""One writer per shard: leases taken atomically on a folder and on S3 (moto), two runners on one root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.lease import LeaseLost, Leases
from eagle_data.runner.run import LeaseHeld
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore

DS = "b7_sharegpt"
SHARDS, PER_SHARD = 4, 100
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    srv = FakeOpenAI(Faults(latency_s=0.02, latency_jitter_s=0.03))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(params=["folder", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An output root on a folder or on moto's S3 server (children find it through AWS_ENDPOINT_URL)."""
    if request.param == "folder":
        yield str(tmp_path)
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        yield f"s3://{bucket}/run"
    finally:
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL")
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved


def generate_on_signal(go: str, url: str, root: str, run_id: str) -> None:
    """A child process: imports done, say so, start when the parent creates `go` (both at once)."""
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    generate(url, root, run_id, lease_ttl_s=5.0)


def generate(url: str, root: str, run_id: str, **settings: float) -> dict:
    """One runner over SHARDS shards of two-turn prompts (also the child processes' entry point)."""
    engine = make_engine("openai", base_url=url, model="m")
    chosen = RunnerSettings(progress_bar=False, max_in_flight=64, initial_in_flight=64, **settings)  # type: ignore[arg-type]
    shards = prompt_shards(SHARDS, PER_SHARD, turns=2)
    return run_generation(engine, spec_for_tests(), shards, ShardStore(root), settings=chosen, log=print, run_id=run_id)


def test_create_exclusive_writes_once_and_refuses_the_second(root: str) -> None:
    store = ShardStore(root)
    assert store.create_exclusive("x/lease.json", b"first")
    assert not store.create_exclusive("x/lease.json", b"second")  # moto answers 412 PreconditionFailed
    assert store.read_bytes("x/lease.json") == b"first"


def test_a_live_lease_is_refused_naming_its_holder_and_an_expired_one_is_taken_over(root: str) -> None:
    store = ShardStore(root)
    first, second = Leases(store, DS, "run-a", ttl_s=2.0), Leases(store, DS, "run-b", ttl_s=60)
    assert first.take("00000") is None
    holder = second.take("00000")
    assert holder is not None and holder.run_id == "run-a" and holder.pid == os.getpid()
    described = holder.describe(time.time())
    assert re.fullmatch(rf"run run-a \(host {holder.host}, pid {os.getpid()}, heartbeat \d s ago\)", described)

    time.sleep(2.1)  # run-a stalled past its ttl
    assert second.take("00000") is None
    with pytest.raises(LeaseLost, match="run run-b"):
        first.renew()
    second.release("00000")
    assert first.take("00000") is None  # released: free at once


def test_a_lease_whose_process_died_on_this_host_is_taken_over_at_once(root: str) -> None:
    store = ShardStore(root)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = Leases(store, DS, "run-killed", ttl_s=3600)
    assert gone.take("00000") is None
    key = f"{DS}/{DS}/_lease/00000/00000000.json"
    lease = store.read_bytes(key).replace(f'"pid": {os.getpid()}'.encode(), f'"pid": {dead.stdout.strip()}'.encode())
    store.write_bytes(key, lease)
    assert Leases(store, DS, "run-next", ttl_s=60).take("00000") is None


def test_a_shard_held_by_a_live_run_is_left_to_it_and_the_call_says_which_run(server: FakeOpenAI, root: str) -> None:
    store = ShardStore(root)
    assert Leases(store, DS, "run-elsewhere", ttl_s=60).take("00002") is None
    with pytest.raises(LeaseHeld, match=r"00002 by run run-elsewhere \(host .*, pid \d+, heartbeat \d+ s ago\)"):
        generate(f"http://127.0.0.1:{server.port}/v1", root, "run-here", lease_wait_s=1.5)
    written = {p for p in (f"{s:05d}" for s in range(SHARDS)) if store.shard_exists(DS, DS, p)}
    assert written == {"00000", "00001", "00003"}
    assert not any(key.startswith("s2-") for key in server.requests), "the held shard was not generated"


def test_two_runners_on_one_root_pay_for_every_turn_once(server: FakeOpenAI, root: str, tmp_path: Path) -> None:
    server.faults = Faults(latency_s=0.1, latency_jitter_s=0.1)  # each shard takes a while: the runs overlap
    url, go = f"http://127.0.0.1:{server.port}/v1", str(tmp_path / "go")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", f"from eagle_data_tests.unit.test_runner_lease import generate_on_signal; "
                                   f"generate_on_signal({go!r}, {url!r}, {root!r}, {name!r})"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name in ("run-one", "run-two")
    ]  # fmt: skip
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    Path(go).touch()
    outputs = [child.communicate(timeout=120)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs

    assert len(server.requests) == SHARDS * PER_SHARD * 2
    twice = {turn: n for turn, n in server.requests.items() if n != 1}
    assert not twice, f"{len(twice)} turns paid more than once, e.g. {list(twice.items())[:3]}"
    out = pl.concat([ShardStore(root).read_shard(DS, DS, f"{s:05d}") for s in range(SHARDS)])
    assert out.height == SHARDS * PER_SHARD and set(out["status"]) == {"ok"}
    assert not ShardStore(root).list(f"{DS}/{DS}/_lease"), "every lease is released"
    assert any("held by run run-" in text for text in outputs), "the two runs met over a shard"
