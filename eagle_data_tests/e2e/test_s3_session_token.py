"""No secret stored (issue 43, item 3): with temporary AWS credentials (a session token), a real materialization
on S3 (moto's server) through the Dagster CLI leaves the token nowhere: not in the instance's SQLite files
under DAGSTER_HOME (runs, event log, compute logs), not in the run's output, not in any object written to the
bucket. Before, every shard's `shard_link` was a URL presigned with the token in it (`X-Amz-Security-Token`)."""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import dagster as dg

from eagle_data.files_server import FILES_URL_ENV
from eagle_data.standins.openai_fake import FakeOpenAI
from eagle_data_tests.conftest import materialize_cli
from eagle_data_tests.fixtures_stages import standin_catalog

DS = "b7_sharegpt"
TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN7f3c9a2e"  # moto takes any session token


def test_a_session_token_is_stored_nowhere(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, demo_model: Path, server: FakeOpenAI
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_", "OPENAI_"))}
    (tmp_path / "home").mkdir()
    env.update(EAGLE_DATA_CATALOG=str(standin_catalog(tmp_path)))
    env.update(EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=f"s3://{s3_bucket}/runs", AWS_ENDPOINT_URL=s3_endpoint,
               AWS_SESSION_TOKEN=TOKEN, DAGSTER_HOME=str(tmp_path / "home"), EAGLE_DATA_DEMO_MODEL=str(demo_model),
               EAGLE_DATA_ENGINE="openai", EAGLE_DATA_MODEL="m", OPENAI_API_KEY="sk-test",
               EAGLE_DATA_BASE_URL=f"http://127.0.0.1:{server.port}/v1",
               **{FILES_URL_ENV: "http://127.0.0.1:3001"})  # fmt: skip
    out = materialize_cli(env, "--select", f"{DS}_prompts,{DS},{DS}_validated", "--partition", "00000")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:  # the links are there: the files server's
        event = instance.get_latest_materialization_event(dg.AssetKey(DS))
        assert event is not None and event.asset_materialization is not None
        link = event.asset_materialization.metadata["shard_link"].value
    assert link == f"http://127.0.0.1:3001/{DS}/{DS}/00000.parquet"
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="runs/").get("Contents", [])]
    assert any(key.endswith(f"{DS}_validated/00000.parquet") for key in keys), keys
    leaks = [str(p) for p in tmp_path.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    leaks += [key for key in keys if TOKEN.encode() in client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()]
    leaks += ["the run's output"] if TOKEN in out.stdout + out.stderr else []
    assert leaks == []
