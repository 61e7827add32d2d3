"""`hidden_states`' partitions follow the mix: none before a mix exists, then one per capture shard of the mix
`training_mix` just wrote (so "Materialize all" never picks a shard past the mix's end), fewer when the mix
shrinks. On a real Dagster instance, with the real validation stage and export."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from eagle_data import layout
from eagle_data.catalog import Adapter, DatasetSpec, load_catalog, shard_key
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.checks import build_checks
from eagle_data.defs.drafter import CAPTURE_SHARDS, CaptureResource, build_drafter_assets, follow_the_mix
from eagle_data.defs.exports import build_exports
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.storage import ShardStore
from eagle_data_tests.fixtures_quality import generation_frame

SHARD_ROWS = 8  # mix rows per capture shard in this test's catalog


@pytest.fixture
def capture_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "catalog.toml"
    user.write_text(f"[drafter.capture]\nshard_rows = {SHARD_ROWS}\nmax_rows = 40\n")
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))


def capture_keys(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> list[str]:
    assert asset.partitions_def is not None
    return asset.partitions_def.get_partition_keys(dynamic_partitions_store=instance)


def test_training_mix_sets_the_capture_partitions_to_the_mixs_shards(tmp_path: Path, capture_catalog: None) -> None:
    spec = DatasetSpec(name="b9_mix", title="b9_mix", adapter=Adapter(prompt_field="q"), max_prompts=20,
                       shard_size=20, target="qwen3-test")  # fmt: skip
    checks = build_checks([spec])
    capture = next(a for a in build_drafter_assets([spec]) if a.key == dg.AssetKey(layout.HIDDEN_STATES_ASSET))
    defs = dg.Definitions(
        assets=[*build_dataset_assets(spec), build_exports([spec], checks), capture],
        asset_checks=checks,
        resources={**shard_resources(StorageResource(root=str(tmp_path / "out"))), "engine": EngineResource(),
                   "capture": CaptureResource()},
    )  # fmt: skip
    job = defs.resolve_implicit_global_asset_job_def()
    store = ShardStore(str(tmp_path / "out"))
    with dg.instance_for_test() as instance:
        assert capture_keys(instance, capture) == []  # no mix yet: nothing to fill, nothing shown
        instance.add_dynamic_partitions(CAPTURE_SHARDS.name, ["00007"])  # e.g. left by a larger mix
        store.write_shard(spec.name, spec.name, "00000", generation_frame(20, 0.0, spec.name))
        validated = job.get_subset(asset_selection={dg.AssetKey(f"{spec.name}_validated")})
        assert validated.execute_in_process(partition_key="00000", instance=instance).success
        result = job.get_subset(asset_selection={dg.AssetKey("training_mix")}).execute_in_process(instance=instance)
        assert result.success
        metadata = result.asset_materializations_for_node("training_mix")[0].metadata
        rows = metadata["mix_rows"].value
        expected = [shard_key(i) for i in range(-(-rows // SHARD_ROWS))]
        assert rows > SHARD_ROWS and capture_keys(instance, capture) == expected
        assert metadata["capture_shards"].value == len(expected)
        assert follow_the_mix(instance, 3) == ["00000"] and capture_keys(instance, capture) == ["00000"]
        assert follow_the_mix(instance, 10_000) == [shard_key(i) for i in range(5)]  # max_rows = 40 caps them


def test_the_demo_definitions_have_no_capture_partition_before_a_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before this change the demo's `hidden_states` had 500 static partitions for a mix of a few hundred rows."""
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    specs = list(load_catalog(profile="demo").values())
    capture = next(a for a in build_drafter_assets(specs) if a.key == dg.AssetKey(layout.HIDDEN_STATES_ASSET))
    with dg.instance_for_test() as instance:
        assert isinstance(capture.partitions_def, dg.DynamicPartitionsDefinition)
        assert capture_keys(instance, capture) == []
        assert follow_the_mix(instance, 210) == ["00000"]  # the demo's 210-row mix: one shard of 2,000 rows
