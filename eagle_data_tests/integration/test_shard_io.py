"""Shards through the shard IO manager: every shard output has its resource key, the files of a run are the ones
its handle_output wrote (nowhere else), and the same run on a folder, on moto's S3 server and on the same
server behind another endpoint (the cuttable proxy) stores the same shards."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import dagster as dg
import polars as pl
import pytest

from eagle_data import layout
from eagle_data.catalog import DatasetSpec, load_catalog
from eagle_data.definitions import build_definitions
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.io_managers import SHARD_IO, ShardIOManager, shard_resources
from eagle_data.defs.metadata import SHARD_DIGEST, URI
from eagle_data.defs.resources import EngineResource, S3ClientResource, StorageResource
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings
from eagle_data.runner.resultlog import ResultLog, stored_usage
from eagle_data.stages import generation
from eagle_data.stages.prompts import PromptShards
from eagle_data.standins.cut_proxy import CutProxy
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore, parquet_bytes
from eagle_data.storage.shards import LazyShards, write_shards
from eagle_data_tests.fixtures_stages import standin_demo

DS = "b7_sharegpt"
KEYS = ("00000", "00001", "00002")
RANGE = {"dagster/asset_partition_range_start": KEYS[0], "dagster/asset_partition_range_end": KEYS[-1]}
SHARD_ASSETS = (layout.prompts_asset(DS), layout.generation_asset(DS), layout.validated_asset(DS))
VARYING = ("latency_s", "finished_at")  # a reply's wall-clock time and when it landed: the only columns that differ


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineResource]:
    """The fake OpenAI server as the engine: its replies are a function of the prompt, so runs answer alike."""
    server = FakeOpenAI(Faults(reply_tokens=(20, 90)))
    server.start()
    monkeypatch.setenv("EAGLE_DATA_ENGINE", "openai")
    monkeypatch.setenv("EAGLE_DATA_BASE_URL", f"http://127.0.0.1:{server.port}/v1")
    yield EngineResource(kind="openai", model="m", api_key_env="")
    server.stop()


def spec() -> DatasetSpec:
    """The demo entry on the stand-in server, with four shards."""
    return standin_demo()[DS].model_copy(update={"max_prompts": 40})


def materialize(resources: dict[str, object]) -> dg.ExecuteInProcessResult:
    """prompts -> generation -> validated of b7_sharegpt over three shards, in one run (a single-run range)."""
    return dg.materialize(
        build_dataset_assets(spec()),
        selection=dg.AssetSelection.assets(*SHARD_ASSETS),
        tags=RANGE,
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
    )


def shard_metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, dict[str, object]]:
    """Each partition's materialization metadata of `asset` (raw values)."""
    events = result.asset_materializations_for_node(asset)
    return {e.partition: {k: v.value for k, v in e.metadata.items()} for e in events if e.partition}


def test_every_shard_output_of_the_definitions_goes_through_the_shard_io_manager():
    specs = list(load_catalog(profile="demo").values())
    defs = build_definitions(specs)
    assert isinstance(defs.resources[SHARD_IO], ShardIOManager)
    names = [asset(s.name) for s in specs for asset in (layout.prompts_asset, layout.generation_asset,
                                                         layout.validated_asset)]  # fmt: skip
    assert len(names) == 18  # three shard assets per dataset, six datasets
    for key in map(dg.AssetKey, names):
        assert defs.get_assets_def(key).get_io_manager_key_for_asset_key(key) == SHARD_IO, key


def test_the_shards_of_a_run_are_the_ones_the_io_manager_wrote_with_their_uri_and_digest(
    tmp_path: Path, engine: EngineResource
):
    """The assets' own storage resource and the IO manager's point at two roots: every shard file lands under
    the IO manager's, none under the assets', and each partition's event names its file and its bytes' sha256."""
    assets_root, shards_root = tmp_path / "assets", tmp_path / "shards"
    shards = StorageResource(root=str(shards_root))
    resources = {**shard_resources(StorageResource(root=str(assets_root))), SHARD_IO: ShardIOManager(storage=shards)}
    result = materialize({**resources, "engine": engine})
    assert result.success
    for asset in SHARD_ASSETS:
        assert not list((assets_root / DS / asset).glob("*.parquet")), f"{asset} wrote a shard itself"
        metadata = shard_metadata(result, asset)
        assert sorted(metadata) == list(KEYS)
        for key, values in metadata.items():
            path = shards_root / layout.shard(DS, asset, key)
            assert values[URI] == str(path)
            assert values[SHARD_DIGEST] == hashlib.sha256(path.read_bytes()).hexdigest()
    generated = pl.read_parquet(shards_root / layout.shard(DS, DS, KEYS[0]))
    prompts = pl.read_parquet(shards_root / layout.shard(DS, f"{DS}_prompts", KEYS[0]))
    assert generated["prompt_id"].to_list() == prompts["prompt_id"].to_list()


def stored(store: ShardStore) -> dict[tuple[str, str], bytes]:
    return {(asset, key): store.read_bytes(layout.shard(DS, asset, key)) for asset in SHARD_ASSETS for key in KEYS}


def stable(data: bytes) -> bytes:
    """A shard's bytes without the VARYING columns, serialized as the shards are."""
    frame = pl.read_parquet(data)
    return parquet_bytes(frame.drop([c for c in VARYING if c in frame.columns]))


def test_a_folder_moto_and_moto_behind_another_endpoint_store_the_same_shards(
    tmp_path: Path, engine: EngineResource, s3_endpoint: str, s3_bucket: str, s3_proxy: CutProxy
):
    """Prompts byte for byte; generation and validated byte for byte once the VARYING columns are dropped
    (re-serialized the same way). Each validated partition's recorded digest is its stored bytes' sha256."""
    proxied = f"http://127.0.0.1:{s3_proxy.port}"
    roots = {
        "local": StorageResource(root=str(tmp_path / "out")),
        "moto": StorageResource(root=f"s3://{s3_bucket}/direct", s3=S3ClientResource(endpoint_url=s3_endpoint)),
        "proxied": StorageResource(root=f"s3://{s3_bucket}/proxied", s3=S3ClientResource(endpoint_url=proxied)),
    }
    shards: dict[str, dict[tuple[str, str], bytes]] = {}
    for name, storage in roots.items():
        result = materialize(shard_resources(storage, engine=engine))
        assert result.success, name
        shards[name] = stored(storage.store())
        digests = shard_metadata(result, layout.validated_asset(DS))
        for key in KEYS:
            data = shards[name][layout.validated_asset(DS), key]
            assert digests[key][SHARD_DIGEST] == hashlib.sha256(data).hexdigest()
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    assert client.list_objects_v2(Bucket=s3_bucket, Prefix="proxied/")["KeyCount"] > 0
    local = shards.pop("local")
    for name, other in shards.items():
        for (asset, key), data in local.items():
            if asset == layout.prompts_asset(DS):
                assert other[asset, key] == data, (name, asset, key)
            else:
                assert stable(other[asset, key]) == stable(data), (name, asset, key)


def test_a_generation_step_stopped_before_the_io_manager_stored_its_shards_pays_nothing_again(tmp_path: Path):
    """The runner hands finished shards over as HANDED result-log parts; a step killed before its IO manager
    ran leaves no shard file, and the next run re-sends nothing, stores every row, and counts the spend once."""
    server = FakeOpenAI()
    server.start()
    spec, store, prompts = spec_for_tests(), ShardStore(str(tmp_path)), prompt_shards(2, 10)
    for key, frame in prompts.items():
        store.write_shard(spec.name, layout.prompts_asset(spec.name), key, frame)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m")
    settings = RunnerSettings(progress_bar=False)

    def run() -> LazyShards:
        inputs = PromptShards(spec, store, list(prompts))
        return generation.generate(spec, store, inputs, engine, log=lambda _: None, settings=settings).shards

    try:
        run()  # the step ends here, as if killed before handle_output
        sent, spent = server.received, stored_usage(store, spec.name)
        assert not any(store.shard_exists(spec.name, spec.name, key) for key in prompts)
        written = write_shards(store, spec.name, spec.name, run())
    finally:
        server.stop()
    assert server.received == sent > 0
    assert {key: s.rows for key, s in written.items()} == {key: 10 for key in prompts}
    assert all(ResultLog(store, spec.name, key).handed() is None for key in prompts)
    assert stored_usage(store, spec.name) == spent
