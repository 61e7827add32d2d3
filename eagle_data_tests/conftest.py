"""Shared fixtures: a real S3 protocol server, the fake OpenAI-compatible server, the demo checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from eagle_data.standins.cut_proxy import CutProxy
from eagle_data.standins.local import free_port
from eagle_data.standins.openai_fake import FakeOpenAI
from eagle_data.storage import ShardStore
from eagle_data_tests.fixtures_demo import demo_run, demo_run_model  # noqa: F401 (fixtures of every test module)
from eagle_data_tests.fixtures_postgres import pg_database  # noqa: F401 (a fixture of every test module)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def materialize_cli(
    env: dict[str, str], *args: str, run_config: dict[str, Any] | None = None, timeout_s: float = 600,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """`dagster asset materialize -m eagle_data.definitions ARGS` with the run's steps in the CLI's own process
    (Dagster's `in_process` executor, merged into `run_config`). The tests calling this check what a run writes
    and refuses, which does not depend on how steps are started, and a process per step costs seconds of CPU
    each. The default, a process per step, runs in test_postgres_instance, test_pools, test_demo_output and the
    browser test. With README's DAGSTER_CLI_ASSET_MATERIALIZE_MODULE_NAME (or DAGSTER_MODULE_NAME) in `env` it
    passes no `-m` (the README's form)."""
    config = {**(run_config or {}), "execution": {"config": {"in_process": {}}}}
    named = env.get("DAGSTER_CLI_ASSET_MATERIALIZE_MODULE_NAME") or env.get("DAGSTER_MODULE_NAME")
    module = [] if named else ["-m", "eagle_data.definitions"]
    command = ["asset", "materialize", *module, *args, "--config-json", json.dumps(config)]
    return subprocess.run([sys.executable, "-m", "dagster", *command], env=env, capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd)  # fmt: skip


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, with throwaway credentials in the environment."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh bucket on the moto server; returns its name."""
    import boto3

    name = f"eagle-test-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_proxy(s3_endpoint: str) -> Iterator[CutProxy]:
    """A cuttable TCP proxy in front of moto's S3 server: an outage of the store, on demand."""
    proxy = CutProxy(urlsplit(s3_endpoint).port or 0)
    yield proxy
    proxy.close()


def store_behind(proxy: CutProxy, bucket: str) -> ShardStore:
    """A store on `bucket` reached through `proxy`, botocore's own retries off: the store's retry window (and
    whatever rides on it) is what the outage tests put under test."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)
    url = f"http://127.0.0.1:{proxy.port}"
    factory = lambda: boto3.client("s3", endpoint_url=url, config=config)  # noqa: E731
    return ShardStore(f"s3://{bucket}/out", s3_client_factory=factory)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    """The fake OpenAI-compatible server on 127.0.0.1 with no faults (a test file overrides it to inject some)."""
    srv = FakeOpenAI()
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ShardStore:
    """A shard store on a local folder, then on the moto S3 server: a test using it runs on both."""
    import boto3

    if request.param == "local":
        return ShardStore(str(tmp_path / "out"))
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return ShardStore(f"s3://{bucket}/runs/a", s3_client_factory=lambda: boto3.client("s3", endpoint_url=endpoint))


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weight Qwen3 stand-in (eagle_data.standins.random_model), built once per machine (offline,
    ~10 s): the model of the tests that need speed, not text. Point EAGLE_DATA_DEMO_MODEL at it to run the demo
    profile on it."""
    from eagle_data.standins.random_model import ensure_random_model, random_model_path

    path = random_model_path()
    try:
        return ensure_random_model(path)
    except OSError:  # an unwritable cache folder: build it in the session's own
        return ensure_random_model(tmp_path_factory.mktemp("random-model") / "random-qwen3")


@pytest.fixture(scope="session", autouse=True)
def demo_profile_on_the_random_model(demo_model: Path) -> Iterator[None]:
    """Every test runs the demo profile on the random-weight stand-in (seconds, where text does not matter), its
    CLI and Dagster subprocesses too; a test that judges real text asks for SmolLM2 (the `smollm2` fixture, or
    EAGLE_DATA_DEMO_MODEL set to it in its own environment, as the shared end-to-end demo run does)."""
    from eagle_data.demo import DEMO_MODEL_ENV

    saved = os.environ.get(DEMO_MODEL_ENV)
    os.environ[DEMO_MODEL_ENV] = str(demo_model)
    yield
    if saved is None:
        os.environ.pop(DEMO_MODEL_ENV, None)
    else:
        os.environ[DEMO_MODEL_ENV] = saved


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct, the real instruct model of the demo (eagle_data.demo), as a transformers folder:
    converted by `make setup` (`eagle-data demo-model`); the tests that judge data run it."""
    from eagle_data.demo import ensure_smollm2

    return ensure_smollm2()


# Whole CLI, browser and Postgres runs, longest first: run in parallel (make test: pytest-xdist, by file, in
# collection order: --no-loadscope-reorder), they start first, so the short tests fill the other workers
# instead of one long test ending the run alone. (xdist's default order, most tests first, put these last.)
LONG_FILES = (
    "test_definitions.py",  # the shared demo run: the longest
    "test_ui_browser.py",
    "test_ui_bad_server.py",
    "test_pools.py",
    "test_postgres_instance.py",
    "test_demo_catalog.py",
    "test_admission_storages.py",
    "test_engine_cli.py",
    "test_capture_checks.py",
    "test_capture_ui.py",
    "test_card_command.py",
)


# The layers, one folder each (`make test` runs them all; `-m unit` etc. selects one): unit tests call pure rooms
# without Dagster; integration tests run Dagster in process; end-to-end tests run the CLIs, a UI, a browser or the
# session's shared demo run (fixtures_demo.py).
LAYERS = ("unit", "integration", "e2e")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (make test): one worker more than the cores (at most 4) on a free machine, so that a worker
    waiting on a server, a timer or a subprocess leaves its core to the others (two workers on two cores left it
    idle 12% of the time); four a core (at most 8) where other work keeps half the cores busy or more, since
    each runnable process gets an equal slice of a busy machine: beside 8 busy loops on two cores three workers
    had 3/11 of it (pytest took 2,133 s, with the untrimmed demo run; trimmed, six workers took 1,339 s and eight
    1,185 s). The load is what the engine's meter sees other processes do over a second (engines/cpus.py)."""
    from eagle_data.engines.cpus import ThreadMeter

    meter = ThreadMeter()
    time.sleep(1.0)
    meter.count()
    cores = len(meter.cpus)
    if (meter.others_busy or 0.0) >= cores / 2:
        return min(4 * cores, 8)
    return min(cores + 1, 4)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))
    for item in items:
        if item.path.parent.name in LAYERS:
            item.add_marker(item.path.parent.name)
