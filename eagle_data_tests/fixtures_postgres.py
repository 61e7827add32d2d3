"""A fresh database per test on the PostgreSQL server of the postgres tests, and a Dagster instance on it.

Needs a server on 127.0.0.1 (`bash .ci/services.sh` as root starts Debian's, with the role below);
EAGLE_TEST_PG_{HOST,PORT,USER,PASSWORD,DB} point elsewhere. Without one a test skips, and fails in CI."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

DEFAULTS = {"HOST": "127.0.0.1", "PORT": "5432", "USER": "eagle_test", "PASSWORD": "eagle_test", "DB": "eagle_test"}
PG = {name: os.environ.get(f"EAGLE_TEST_PG_{name}", default) for name, default in DEFAULTS.items()}


def connect(dbname: str) -> Any:
    return psycopg2.connect(host=PG["HOST"], port=int(PG["PORT"]), user=PG["USER"], password=PG["PASSWORD"],
                            dbname=dbname, connect_timeout=3)  # fmt: skip


def deployment_dagster_yaml(repo: Path) -> str:
    """The image's instance file as docker/Dockerfile makes it: the root dagster.yaml, Postgres storage appended."""
    return (repo / "dagster.yaml").read_text() + (repo / "docker" / "postgres-storage.yaml").read_text()


def postgres_storage(dbname: str) -> dict[str, Any]:
    """The `storage` section of a Dagster instance on `dbname` (as docker/postgres-storage.yaml writes it)."""
    db = {"scheme": "postgresql+psycopg2", "hostname": PG["HOST"], "port": int(PG["PORT"]), "username": PG["USER"],
          "password": PG["PASSWORD"], "db_name": dbname}  # fmt: skip
    return {"postgres": {"postgres_db": db}}


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh database on the test server, dropped afterwards."""
    try:
        admin = connect(PG["DB"])
    except psycopg2.OperationalError as exc:
        reason = (
            f"no PostgreSQL at {PG['HOST']}:{PG['PORT']} for role {PG['USER']}: {str(exc).strip()}; "
            "run `bash .ci/services.sh` as root"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the postgres tests: {reason}")
        pytest.skip(reason)
    admin.autocommit = True
    name = f"eagle_test_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        _drop(admin, name)
        admin.close()


def _drop(admin: Any, name: str, patience_s: float = 30.0) -> None:
    """Drop the test database, waiting out a backend this role may not terminate (an autovacuum worker
    or a closing Dagster process seen mid-exit), which FORCE refuses instead of waiting for."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            with admin.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except (psycopg2.errors.InsufficientPrivilege, psycopg2.errors.ObjectInUse):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
