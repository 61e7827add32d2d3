"""The `sglang` kind through the real sglang-router (PyPI `sglang-router`, its Rust binary, on CPU) in front of
SGLang stand-ins: a dataset generated with one worker SIGKILLed mid-run, and the router's bad answers refused
before any request is paid."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from eagle_data.catalog import Breaker
from eagle_data.engines import EngineSettings, build_engine, make_engine
from eagle_data.engines.launcher import LaunchConfig, Launcher
from eagle_data.engines.sglang import SGLangEngine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.standins.openai_fake import prompt_shards, spec_for_tests
from eagle_data.standins.sglang_fake import free_port_block
from eagle_data.storage import ShardStore
from eagle_data.types import FatalError
from eagle_data_tests.unit.test_sglang import FAKE, MODEL, REPO

pytest.importorskip("sglang_router", reason="sglang-router is in the test extra: pip install -e '.[test]'")

FAST = RunnerSettings(max_in_flight=8, initial_in_flight=8, backoff_base_s=0.05, backoff_cap_s=0.2, progress_bar=False)
OTHER_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class Routers:
    """Three real routers: `fleet` in front of two target workers, `mixed` in front of one target worker
    and one serving another model, `empty` in front of a port nobody listens on."""

    fleet: str
    mixed: str
    empty: str
    workers: Launcher
    other: Launcher
    answers: Path


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return json.loads(resp.read())


def healthy_workers(url: str) -> int:
    try:
        return sum(bool(w.get("is_healthy")) for w in get_json(url + "/workers")["workers"])
    except OSError:
        return -1  # not listening yet


@contextlib.contextmanager
def router(port: int, workers: list[str], logs: Path) -> Iterator[str]:
    """One sglang-router process (round robin); its Prometheus port is its own, so several can run."""
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port + 1), "--policy", "round_robin",
            "--log-level", "warn", "--worker-urls", *workers]  # fmt: skip
    # It asks the hub for the workers' tokenizer after registering them: offline that fails, without delaying
    # the registration, and /generate with input_ids needs no tokenizer.
    with (logs / f"router-{port}.log").open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routers]:
    tmp = tmp_path_factory.mktemp("router")
    answers = tmp / "answers"
    answers.mkdir()
    common = {"command": FAKE, "env": {"PYTHONPATH": str(REPO)}, "log_dir": str(tmp / "logs"), "health_timeout_s": 30}
    ports = free_port_block(10, start=20000, stop=32000)  # below the ephemeral range: the routers connect out
    fleet = LaunchConfig(model_path=MODEL, num_servers=2, base_port=ports,
                         extra_args=("--delay", "0.1", "--log", str(answers / "answers-{port}.jsonl")), **common)
    other = LaunchConfig(model_path=OTHER_MODEL, num_servers=1, base_port=ports + 2, **common)  # fmt: skip
    with Launcher(fleet) as workers, Launcher(other) as wrong, contextlib.ExitStack() as stack:
        urls = workers.urls
        fleet_url = stack.enter_context(router(ports + 3, urls, tmp))
        mixed_url = stack.enter_context(router(ports + 5, [urls[0], wrong.urls[0]], tmp))
        empty_url = stack.enter_context(router(ports + 7, [f"http://127.0.0.1:{ports + 9}"], tmp))
        deadline = time.monotonic() + 20
        while healthy_workers(fleet_url) < 2 or healthy_workers(mixed_url) < 2 or healthy_workers(empty_url) < 0:
            assert time.monotonic() < deadline, f"the routers never listed their workers (logs in {tmp})"
            time.sleep(0.05)
        yield Routers(fleet_url, mixed_url, empty_url, workers, wrong, answers)


def engine(url: str) -> SGLangEngine:
    """For a probe alone: the chat path probes the same and needs no target tokenizer."""
    return make_engine("sglang", urls=(url,), model=MODEL, mode="chat")


def check(url: str) -> str:
    async def run() -> str:
        eng = engine(url)
        try:
            return await eng.check()
        finally:
            await eng.aclose()

    return asyncio.run(run())


def answers_in(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("answers-*.jsonl")) for line in f.read_text().splitlines()]


def prompt_of(answer: dict) -> str:
    """The prompt an answer was for: the router drops the prompt-id header, the request id keeps it."""
    return answer["rid"].rsplit("-", 1)[0]


def test_a_router_with_no_healthy_worker_is_one_line_before_any_request(routers: Routers) -> None:
    with pytest.raises(FatalError) as err:
        check(routers.empty)
    line = str(err.value)
    assert "\n" not in line and routers.empty in line and "no healthy worker" in line and "--worker-urls" in line


def test_a_router_worker_serving_another_model_is_one_line_before_any_request(routers: Routers) -> None:
    before = len(answers_in(routers.answers))
    with pytest.raises(FatalError) as err:
        check(routers.mixed)
    line = str(err.value)
    assert "\n" not in line and routers.mixed in line and routers.other.urls[0] in line and OTHER_MODEL in line
    assert len(answers_in(routers.answers)) == before  # nothing was generated


def test_a_url_answering_html_is_one_line_naming_it_before_any_request() -> None:
    """A proxy or login page in front of the router: every path answers 200 with HTML."""

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><html><body>Sign in</body></html>", content_type="text/html")

    async def run() -> tuple[str, str]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", page)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        eng = engine(url)
        try:
            with pytest.raises(FatalError) as err:
                await eng.check()
            return url, str(err.value)
        finally:
            await eng.aclose()
            await runner.cleanup()

    url, line = asyncio.run(run())
    assert "\n" not in line and url in line and "text/html" in line and "EAGLE_DATA_BASE_URL" in line


def test_a_dataset_through_the_router_with_one_worker_killed_loses_nothing_and_pays_nothing_twice(
    routers: Routers, tmp_path: Path
) -> None:
    assert check(routers.fleet).startswith("SGLang: 1/1 servers up (2 healthy workers behind sglang-router)")
    spec = spec_for_tests(breaker=Breaker(enabled=False))
    shards = prompt_shards(2, 20, turns=2)
    victim = routers.workers.servers[1]
    stop = threading.Event()

    def kill_mid_run() -> None:
        while not stop.is_set() and len(answers_in(routers.answers)) < 20:
            stop.wait(0.01)
        os.killpg(victim.process.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_mid_run)
    killer.start()
    try:
        kind = build_engine(EngineSettings(kind="sglang", model=MODEL, base_url=routers.fleet), spec)  # one URL
        reports = run_generation(kind, spec, shards, ShardStore(str(tmp_path)), settings=FAST, log=lambda _: None)
    finally:
        stop.set()
        killer.join()
    assert victim.process.wait(timeout=5) == -signal.SIGKILL  # it died mid-run, with requests in flight

    store = ShardStore(str(tmp_path))
    rows = [r for key in shards for r in store.read_shard(spec.name, spec.name, key).to_dicts()]
    answers = answers_in(routers.answers)
    victim_port = int(victim.url.rsplit(":", 1)[1])
    survivor = Counter((prompt_of(a), a["prompt_tokens"]) for a in answers if a["port"] != victim_port)
    sent: dict[str, list] = {}
    for a in answers:
        sent.setdefault(prompt_of(a), []).append(a["output"])
    assert sorted(r["prompt_id"] for r in rows) == sorted(p for f in shards.values() for p in f["prompt_id"])
    assert {r["status"] for r in rows} == {"ok"}  # 0 lost (no stand-in reply reaches max_tokens)
    assert max(survivor.values()) == 1  # no turn answered twice by the live worker: nothing paid twice
    for row in rows:
        turns = [m["output_ids"] for m in row["messages"] if m["role"] == "assistant"]
        assert len(turns) == 2 and all(ids in sent[row["prompt_id"]] for ids in turns)  # the workers' own ids
    assert any(a["port"] == victim_port for a in answers)  # both workers served before the kill
    assert sorted(reports) == sorted(shards)
