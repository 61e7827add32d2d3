"""A Dagster instance on a real PostgreSQL: one demo shard materialized by the real CLI with the
deployment's instance settings (dagster.yaml + docker/postgres-storage.yaml), then its run and events read back.

Needs a server on 127.0.0.1 (`bash .ci/services.sh` as root starts Debian's, with the role below);
EAGLE_TEST_PG_{HOST,PORT,USER,PASSWORD,DB} point elsewhere (fixtures_postgres). Each test gets a fresh
database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster_postgres import PostgresRunStorage

from eagle_data_tests.fixtures_postgres import PG, connect, deployment_dagster_yaml

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
ASSETS = ["b7_sharegpt", "b7_sharegpt_prompts", "b7_sharegpt_validated"]


def test_cli_materializes_a_shard_into_postgres_and_reads_it_back(
    pg_database: str, demo_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(deployment_dagster_yaml(REPO))
    instance_env = {
        "DAGSTER_HOME": str(home), "DAGSTER_POSTGRES_HOST": PG["HOST"], "DAGSTER_POSTGRES_PORT": PG["PORT"],
        "DAGSTER_POSTGRES_USER": PG["USER"], "DAGSTER_POSTGRES_PASSWORD": PG["PASSWORD"],
        "DAGSTER_POSTGRES_DB": pg_database,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    env.update(instance_env, EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(tmp_path / "out"),
               EAGLE_DATA_DEMO_MODEL=str(demo_model))
    out = subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_data.definitions",
         "--select", ",".join(ASSETS), "--partition", "00000"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]

    for name, value in instance_env.items():
        monkeypatch.setenv(name, value)
    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["dagster/partition"] == "00000"
        for key in ASSETS:
            records = instance.fetch_materializations(dg.AssetKey(key), limit=10).records
            assert [(r.run_id, r.partition_key) for r in records] == [(run.run_id, "00000")]

    # The records live in Postgres itself, not in SQLite files under DAGSTER_HOME.
    with connect(pg_database) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, status FROM runs")
        assert cur.fetchall() == [(run.run_id, "SUCCESS")]
        cur.execute("SELECT asset_key, partition FROM event_logs "
                    "WHERE dagster_event_type = 'ASSET_MATERIALIZATION' ORDER BY asset_key")
        assert cur.fetchall() == [(f'["{key}"]', "00000") for key in sorted(ASSETS)]
    conn.close()
    assert not list(home.rglob("*.db"))
