"""Engine settings, fatal answers and secrets through the real Dagster CLI, against a fake server on 127.0.0.1.

Regressions: run config with one engine field no longer switches to the demo model (#10 case 4); a bad or
missing key fails the step with the server's line before the shard is sent (#10 case 5); neither the API
key a server echoes nor a base URL's password reaches the output root, DAGSTER_HOME or the output (#11 case 5).
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data_tests.conftest import materialize_cli
from eagle_data_tests.fixtures_stages import standin_catalog

DS = "b7_sharegpt"
SELECT = f"{DS}_prompts,{DS}"
SHARD = 10  # prompts per shard on the demo profile
KEY = "sk-test-ECHOED-KEY-4f9a1c"
PASSWORD = "url-PASSWORD-8d2e7b"


@pytest.fixture
def env(tmp_path: Path, demo_model: Path, server: FakeOpenAI) -> dict[str, str]:
    """The openai engine on the demo profile's catalog, pointed at the fake; a fresh DAGSTER_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_", "OPENAI_"))}
    (tmp_path / "home").mkdir()
    env.update(EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(tmp_path / "out"), DAGSTER_HOME=str(tmp_path / "home"),
               EAGLE_DATA_DEMO_MODEL=str(demo_model), EAGLE_DATA_ENGINE="openai", EAGLE_DATA_MODEL="m",
               EAGLE_DATA_BASE_URL=f"http://127.0.0.1:{server.port}/v1", OPENAI_API_KEY=KEY,
               EAGLE_DATA_CATALOG=str(standin_catalog(tmp_path)))  # fmt: skip
    return env


def materialize(env: dict[str, str], run_config: dict[str, Any] | None = None) -> subprocess.CompletedProcess:
    return materialize_cli(env, "--select", SELECT, "--partition", "00000", run_config=run_config)


def generations(tmp_path: Path) -> pl.DataFrame:
    return pl.read_parquet(tmp_path / "out" / DS / DS / "00000.parquet")


def prompts_asked(server: FakeOpenAI) -> int:
    return len({turn.split("#")[0] for turn in server.requests})


def leaks(tmp_path: Path, out: subprocess.CompletedProcess, secret: str) -> list[str]:
    """Where `secret` appears: files under the output root and DAGSTER_HOME (read as bytes), and the output."""
    files = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    streams = [name for name, text in (("stdout", out.stdout), ("stderr", out.stderr)) if secret in text]
    return [str(p.relative_to(tmp_path)) for p in files] + streams


def test_one_engine_field_in_run_config_keeps_the_environments_engine(
    env: dict[str, str], server: FakeOpenAI, tmp_path: Path
) -> None:
    out = materialize(env, {"resources": {"engine": {"config": {"timeout_s": 30}}}})
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert prompts_asked(server) == SHARD  # the openai engine answered, not the demo model
    rows = generations(tmp_path)
    assert set(rows["engine"]) == {"openai"} and set(rows["status"]) == {"ok"}


def test_a_bad_key_fails_the_step_with_the_servers_line_before_the_shard_is_sent_and_never_leaks(
    env: dict[str, str], server: FakeOpenAI, tmp_path: Path
) -> None:
    server.faults = Faults(force_status=401, echo_auth=True)  # a careless server repeats the key it got
    env["EAGLE_DATA_MAX_IN_FLIGHT"] = "1"  # one request out at a time: the first answer decides
    out = materialize(env)
    assert out.returncode != 0
    assert f"{DS}: http_401: HTTP 401: forced 401 (got Bearer ***)" in out.stdout + out.stderr
    assert server.received == 1 < SHARD
    assert leaks(tmp_path, out, KEY) == []


def test_a_missing_key_fails_the_step_before_any_request(
    env: dict[str, str], server: FakeOpenAI, tmp_path: Path
) -> None:
    del env["OPENAI_API_KEY"]
    out = materialize(env)
    assert out.returncode != 0
    assert "environment variable OPENAI_API_KEY is empty: export the API key" in out.stdout + out.stderr
    assert server.received == 0


def test_a_base_url_password_is_sent_as_basic_auth_and_shown_nowhere(
    env: dict[str, str], server: FakeOpenAI, tmp_path: Path
) -> None:
    del env["OPENAI_API_KEY"]
    env["EAGLE_DATA_BASE_URL"] = f"http://user:{PASSWORD}@127.0.0.1:{server.port}/v1"
    out = materialize(env)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert server.auth_headers == {f"Basic {basic}"} and prompts_asked(server) == SHARD
    assert f"http://***@127.0.0.1:{server.port}/v1" in out.stdout + out.stderr
    assert leaks(tmp_path, out, PASSWORD) == []


def test_a_base_url_with_a_password_in_run_config_is_refused_before_dagster_stores_it(
    env: dict[str, str], server: FakeOpenAI, tmp_path: Path
) -> None:
    url = f"http://user:{PASSWORD}@127.0.0.1:{server.port}/v1"
    out = materialize(env, {"resources": {"engine": {"config": {"base_url": url}}}})
    assert out.returncode != 0 and 'unexpected config entry "base_url"' in out.stdout + out.stderr, out.stderr[-2000:]
    assert server.received == 0
    assert leaks(tmp_path, out, PASSWORD) == []  # the run database, event log and compute logs included
