"""A root that cannot take shards stops a generation run with one line before any request is paid for: a
folder root that is a file, an S3 bucket that does not exist, credentials the S3 server refuses (moto's own
authentication, switched on)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import moto.settings
import pytest

from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, S3ClientResource, StorageResource
from eagle_data.standins.openai_fake import FakeOpenAI
from eagle_data_tests.fixtures_stages import standin_demo

DS = "b7_sharegpt"


def generate(root: str, endpoint: str | None, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> str:
    """The generation asset of the demo dataset, shard 00000, on `root`: its failure's description."""
    for name, value in {"EAGLE_DATA_ENGINE": "openai", "EAGLE_DATA_MODEL": "m", "OPENAI_API_KEY": "sk-test",
                        "EAGLE_DATA_BASE_URL": f"http://127.0.0.1:{server.port}/v1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assets = {a.key.to_user_string(): a for a in build_dataset_assets(standin_demo()[DS])}
    resources = {**shard_resources(StorageResource(root=root, s3=S3ClientResource(endpoint_url=endpoint))),
                 "engine": EngineResource()}  # fmt: skip
    result = dg.materialize(list(assets.values()), selection=[DS], partition_key="00000", resources=resources,
                            raise_on_error=False)  # fmt: skip
    failures = [e for e in result.all_events if e.is_step_failure]
    assert not result.success and len(failures) == 1
    return failures[0].step_failure_data.user_failure_data.description


def test_a_folder_root_that_is_a_file(tmp_path: Path, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "out"
    root.write_text("not a folder")
    line = generate(str(root), None, server, monkeypatch)
    assert line.endswith(f"EAGLE_DATA_ROOT={root} is a file, not a folder: point EAGLE_DATA_ROOT at a folder")
    assert "\n" not in line and not server.requests


def test_an_s3_bucket_that_does_not_exist(s3_endpoint: str, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch):
    line = generate("s3://no-such-bucket/runs", s3_endpoint, server, monkeypatch)
    assert "S3 bucket 'no-such-bucket' does not exist at" in line and "create it" in line
    assert "\n" not in line and not server.requests


def test_credentials_the_s3_server_refuses(
    s3_endpoint: str, s3_bucket: str, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks every key from now on
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAREALKEY00000")
    line = generate(f"s3://{s3_bucket}/runs", s3_endpoint, server, monkeypatch)
    assert f"S3 bucket '{s3_bucket}' at" in line and "check credentials" in line
    assert "\n" not in line and not server.requests
