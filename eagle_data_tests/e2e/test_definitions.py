"""The Dagster layer end to end: a real instance, the real CLI, local and S3 storage; and every test of the
session's shared demo run (fixtures_demo.py), in this one file so that one test worker makes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster_aws.s3 import S3Resource

from eagle_data.catalog import catalog
from eagle_data.cli import MAX_NOTES, RunView
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, S3ClientResource, StorageResource
from eagle_data.quality import KEPT
from eagle_data.stage_table import DATASET_STAGES, asset_of
from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data.storage import ShardStore
from eagle_data_tests.e2e.test_demo_output import BUDGET
from eagle_data_tests.fixtures_demo import DEMO_RUN_TIMEOUT_S, DemoRun
from eagle_data_tests.fixtures_stages import standin_demo

GENERATION_COLUMNS = {
    "prompt_id", "dataset", "config_hash", "engine", "model", "provider", "status", "finish_reason", "reasoning",
    "content", "output_ids", "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost_usd", "latency_s",
    "attempts", "error", "finished_at",
}
# The first test to ask for the shared demo run waits for it: pytest-timeout's 1500 s ended it at load 10.
pytestmark = pytest.mark.timeout(DEMO_RUN_TIMEOUT_S + 600)
VALIDATED_COLUMNS = {"prompt_id", "input_ids", "loss_mask", "num_tokens", "loss_tokens", "verdict"}
PROMPTS_COLUMNS = {"prompt_id", "dataset", "shard", "messages", "source_id", "source_row"}


@pytest.fixture
def demo_env(tmp_path: Path, demo_model: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    (tmp_path / "home").mkdir()
    env.update(EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(tmp_path / "out"),
               DAGSTER_HOME=str(tmp_path / "home"), EAGLE_DATA_DEMO_MODEL=str(demo_model))
    return env


def test_definitions_hold_each_stage_tables_assets_per_dataset_in_its_group_plus_the_exports_and_drafter_inputs():
    from eagle_data.definitions import defs

    graph = defs.resolve_asset_graph()
    groups: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        groups.setdefault(graph.get(key).group_name, set()).add(key.to_user_string())
    assert groups.pop("exports") == {"training_mix"}
    assert groups.pop("drafter") == {"draft_vocab", "hidden_state_plan", "hidden_states"}
    assert groups == {d: {asset_of(stage.name, d) for stage in DATASET_STAGES} for d in catalog()}
    assert defs.get_sensor_def("catalog_order").default_status == dg.DefaultSensorStatus.STOPPED


def test_cli_lists_the_dataset_assets_the_mix_and_the_drafter_inputs(demo_env: dict[str, str]):
    out = subprocess.run([sys.executable, "-m", "dagster", "asset", "list", "-m", "eagle_data.definitions"],
                         env=demo_env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    listed = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    drafter = {"draft_vocab", "hidden_state_plan", "hidden_states"}
    datasets = [a for a in listed if f"{a}_prompts" in listed]
    dataset_assets = [a for a in listed if a not in {"training_mix", *drafter}]
    assert datasets and len(dataset_assets) == len(DATASET_STAGES) * len(datasets)
    assert {"training_mix", *drafter} <= set(listed)


def test_the_demo_run_writes_the_design_columns_and_exports_every_passing_row(demo_run: DemoRun):
    assert demo_run.code == 0, demo_run.printed[-3000:]
    root = demo_run.root / "b7_sharegpt"
    keys = demo_run.spec.partition_keys
    passing, heights = [], []
    for key in keys:
        prompts = pl.read_parquet(root / "b7_sharegpt_prompts" / f"{key}.parquet")
        generations = pl.read_parquet(root / "b7_sharegpt" / f"{key}.parquet")
        validated = pl.read_parquet(root / "b7_sharegpt_validated" / f"{key}.parquet")
        assert set(prompts.columns) >= PROMPTS_COLUMNS
        heights.append(prompts.height)
        assert set(generations.columns) >= GENERATION_COLUMNS
        assert set(validated.columns) >= VALIDATED_COLUMNS
        assert set(generations["prompt_id"]) == set(prompts["prompt_id"]) == set(validated["prompt_id"])
        assert set(generations["status"]) <= {"ok", "truncated"}
        assert validated.schema["input_ids"] == pl.List(pl.Int32)
        assert validated.schema["loss_mask"] == pl.List(pl.UInt8)
        passing.append(validated.filter(pl.col("verdict").is_in(list(KEPT))))
    shard_size = demo_run.spec.shard_size
    assert len(heights) == len(keys) and all(0 < height <= shard_size for height in heights)
    train = pl.read_parquet(root / "export" / "train.parquet")
    lines = (root / "export" / "prompts.jsonl").read_text().splitlines()  # the default trainer file
    ids = pl.concat(passing)["prompt_id"]
    assert train.height == len(lines) == ids.len() > 0
    assert sorted(json.loads(line)["id"] for line in lines) == sorted(ids.to_list())
    assert pl.read_parquet(demo_run.root / "training_mix" / "training_mix" / "mix.parquet").height == train.height


def test_the_demo_materializes_its_partition_range_in_one_run(demo_run: DemoRun, monkeypatch: pytest.MonkeyPatch):
    assert demo_run.code == 0, demo_run.printed[-3000:]
    keys = demo_run.spec.partition_keys
    monkeypatch.setenv("DAGSTER_HOME", str(demo_run.home))
    with dg.DagsterInstance.get() as instance:
        (run,) = [r for r in instance.get_runs() if dg.AssetKey("training_mix") not in (r.asset_selection or ())]
        assert run.status == dg.DagsterRunStatus.SUCCESS
        for asset in ("b7_sharegpt_prompts", "b7_sharegpt", "b7_sharegpt_validated"):
            records = instance.fetch_materializations(dg.AssetKey(asset), limit=100).records
            assert sorted((r.run_id, r.partition_key) for r in records) == [(run.run_id, key) for key in keys]


def test_the_demo_goes_whole_to_the_log_and_prints_a_few_notes_and_a_summary(demo_run: DemoRun):
    """The session's shared `eagle-data demo` run: every shard of the demo dataset's three assets."""
    assert demo_run.code == 0, demo_run.printed[-3000:]
    printed = demo_run.printed.rstrip("\n").split("\n")
    logs = sorted((demo_run.home / "logs").glob("demo-b7_sharegpt-*.log"))
    assert len(logs) == 1 and printed[-1] == f"[eagle-data] full Dagster log: {logs[0]}"
    log = logs[0].read_text()
    assert "STEP_START" in log and "RUN_SUCCESS" in log and log.count("\n") > 3 * len(printed)
    notes = [p for p in printed if p.startswith("  ")]
    prompts = sorted((demo_run.root / "b7_sharegpt" / "b7_sharegpt_prompts").glob("*.parquet"))
    wrote = sum(pl.read_parquet(path).height for path in prompts)
    assert notes[0] == "  b7_sharegpt_prompts: started" and any(f"wrote {wrote} prompts" in n for n in notes)
    # What was printed is exactly the notes of the log's lines (heartbeats are thinned by the clock, and count
    # towards the MAX_NOTES shown: a run that printed more of them reached "the rest is in the log" sooner).
    replay = RunView()
    from_log = [n for raw in log.split("\n") if (n := replay.note(raw, now=0.0)) and "heartbeat" not in n]
    shown = [n for n in notes if "heartbeat" not in n]
    if shown[-1] == "  ... (the rest is in the log)":
        shown, from_log = shown[:-1], from_log[: len(shown) - 1]
    assert shown == from_log
    assert len(printed) < BUDGET and len(notes) <= MAX_NOTES + 1  # its last: "the rest is in the log"
    assert any(p.startswith("[eagle-data] output: ") and f"({len(prompts)} validated shards)" in p for p in printed)
    assert any(p.startswith("[eagle-data] asked '") and ", the model: " in p for p in printed)  # its own words


def _materialize_b3(storage: StorageResource) -> pl.DataFrame:
    spec = standin_demo()["b3_magicoder"]
    result = dg.materialize(
        build_dataset_assets(spec),
        selection=dg.AssetSelection.all() - dg.AssetSelection.assets("b3_magicoder_estimate"),
        partition_key="00000",
        resources={**shard_resources(storage), "engine": EngineResource(kind="openai", model="m", api_key_env="")},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    return storage.store().read_shard("b3_magicoder", "b3_magicoder_validated", "00000")


def test_s3_run_gives_the_same_rows_as_the_local_run(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
):
    """Replies from the fake server (the same for the same prompt), so both runs answer alike in a second."""
    server = FakeOpenAI(Faults(reply_tokens=(20, 90)))  # long enough for the demo profile's gates
    server.start()
    monkeypatch.setenv("EAGLE_DATA_ENGINE", "openai")  # the generation asset's pool is the environment's engine
    monkeypatch.setenv("EAGLE_DATA_BASE_URL", f"http://127.0.0.1:{server.port}/v1")
    try:
        local = _materialize_b3(StorageResource(root=str(tmp_path / "local")))
        s3_client = S3ClientResource(endpoint_url=s3_endpoint)
        s3 = _materialize_b3(StorageResource(root=f"s3://{s3_bucket}/eagle", s3=s3_client))
    finally:
        server.stop()
    stable = [c for c in local.columns if c not in ("latency_s", "finished_at")]
    assert local.height == 10
    assert local.select(stable).equals(s3.select(stable))
    client = S3ClientResource(endpoint_url=s3_endpoint).get_client
    keys = ShardStore(f"s3://{s3_bucket}/eagle", client).list("b3_magicoder")
    assert "b3_magicoder/b3_magicoder_validated/00000.parquet" in keys
    prompts = ("b3_magicoder", "b3_magicoder_prompts", "00000")  # no timings in it: the same bytes on both roots
    on_s3 = ShardStore(f"s3://{s3_bucket}/eagle", client).shard_bytes(*prompts)
    assert ShardStore(str(tmp_path / "local")).shard_bytes(*prompts) == on_s3


def test_the_s3_settings_reach_dagster_aws_client_and_credentials_never_come_from_config(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")  # from the environment, the only place credentials come from
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    client = S3ClientResource(endpoint_url="http://127.0.0.1:9", region_name="eu-west-1", max_attempts=2).get_client()
    assert (client.meta.endpoint_url, client.meta.region_name) == ("http://127.0.0.1:9", "eu-west-1")
    assert client.meta.config.retries == {"total_max_attempts": 3, "mode": "standard"}  # botocore's count: 2 retries
    params = {"Bucket": "b", "Key": "k"}
    signed = client.generate_presigned_url("get_object", Params=params)
    anonymous = S3ClientResource(use_unsigned_session=True).get_client()
    unsigned = anonymous.generate_presigned_url("get_object", Params=params)
    assert "Signature" in signed and "Signature" not in unsigned  # dagster-aws's S3Resource disables signing
    assert set(S3ClientResource.model_fields) < set(S3Resource.model_fields)  # its fields, less the credentials
    assert not {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"} & set(S3ClientResource.model_fields)
