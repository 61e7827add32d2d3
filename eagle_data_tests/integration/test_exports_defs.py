"""The export's gate across runs, on a real Dagster instance with the real validation stage and checks.

Regression for issue #10 case 3: after a blocking check failed on shards 00001 and 00002, `training_mix`
launched on its own succeeded and exported rows of those shards (a blocking check stops only the steps of
its own run).
"""

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from eagle_data import layout
from eagle_data.catalog import Adapter, DatasetSpec
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.checks import build_checks
from eagle_data.defs.exports import build_exports
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.stages import validation
from eagle_data.storage import ShardStore
from eagle_data.storage.shards import StoredShards
from eagle_data_tests.fixtures_quality import generation_frame

ROWS = 50
SHARES = {"00000": 0.0, "00001": 0.87, "00002": 0.87, "00003": 0.0}  # share of empty "OK." replies per shard


def spec(name: str, shards: int) -> DatasetSpec:
    return DatasetSpec(name=name, title=name, adapter=Adapter(prompt_field="q"), max_prompts=shards * ROWS,
                       shard_size=ROWS, target="qwen3-test")  # fmt: skip


def shard_frame(dataset: str, key: str, empty_share: float) -> pl.DataFrame:
    """A generation shard whose prompt ids start with its partition key."""
    frame = generation_frame(ROWS, empty_share=empty_share, dataset=dataset)
    return frame.with_columns(prompt_id=pl.format("{}-{}", pl.lit(key), pl.col("prompt_id")))


@dataclass
class Gate:
    instance: dg.DagsterInstance
    root: Path
    defs: dict[str, dg.Definitions]  # dataset name -> definitions of its assets, checks and the export


def definitions(ds: DatasetSpec, root: Path) -> dg.Definitions:
    checks = build_checks([ds])
    return dg.Definitions(
        assets=[*build_dataset_assets(ds), build_exports([ds], checks)],
        asset_checks=checks,
        resources={**shard_resources(StorageResource(root=str(root))), "engine": EngineResource()},
    )


def run(
    instance: dg.DagsterInstance, defs: dg.Definitions, asset: str, partition: str | None = None, checks: bool = True
) -> dg.ExecuteInProcessResult:
    """One run of one asset (with its checks unless told not to), as launched from the UI."""
    job = defs.resolve_implicit_global_asset_job_def()
    selection = {"asset_selection": {dg.AssetKey(asset)}} | ({} if checks else {"asset_check_selection": set()})
    return job.get_subset(**selection).execute_in_process(partition_key=partition, instance=instance,
                                                          raise_on_error=False)  # fmt: skip


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    """b9_gate: shards 00001 and 00002 fail `empty_response`, 00003 is re-validated without its check step
    (validation judged its gates on the bytes it stored: its quality record says so). b9_none: its one shard
    fails. Each partition in its own run, as a user launching them from the UI would. b9_range: one run over
    00000...00002 (a backfill), where 00001 fails."""
    root = tmp_path_factory.mktemp("gate")
    store = ShardStore(str(root))
    with dg.DagsterInstance.ephemeral() as instance:
        defs = {}
        for ds, shares in ((spec("b9_gate", 4), SHARES), (spec("b9_none", 1), {"00000": 0.87})):
            defs[ds.name] = definitions(ds, root)
            for key, share in shares.items():
                store.write_shard(ds.name, ds.name, key, shard_frame(ds.name, key, share))
                run(instance, defs[ds.name], f"{ds.name}_validated", key)
        assert run(instance, defs["b9_gate"], "b9_gate_validated", "00003", checks=False).success
        ranged = spec("b9_range", 3)
        defs[ranged.name] = definitions(ranged, root)
        for key, share in {"00000": 0.0, "00001": 0.87, "00002": 0.0}.items():
            store.write_shard(ranged.name, ranged.name, key, shard_frame(ranged.name, key, share))
        tags = {"dagster/asset_partition_range_start": "00000", "dagster/asset_partition_range_end": "00002"}
        job = defs[ranged.name].resolve_implicit_global_asset_job_def()
        job.get_subset(asset_selection={dg.AssetKey("b9_range_validated")}).execute_in_process(
            instance=instance, tags=tags, raise_on_error=False
        )
        yield Gate(instance, root, defs)


def test_training_mix_alone_leaves_out_shards_whose_blocking_check_failed_in_an_earlier_run(gate: Gate) -> None:
    result = run(gate.instance, gate.defs["b9_gate"], "training_mix")
    assert result.success
    mixed = pl.read_parquet(gate.root / layout.mix())
    train = pl.read_parquet(gate.root / layout.export_file("b9_gate", layout.TRAIN_FILE))
    assert set(mixed["prompt_id"].str.slice(0, 5)) == set(train["prompt_id"].str.slice(0, 5)) == {"00000", "00003"}
    assert mixed.height == train.height > 0
    metadata = result.asset_materializations_for_node("training_mix")[0].metadata
    table = metadata["excluded"].value
    assert metadata["excluded_shards"].value == 2
    assert "| b9_gate | 00001 | empty_response failed" in table and "| b9_gate | 00002 | empty_response failed" in table
    parity = result.get_asset_check_evaluations()[0]  # the blocking trainer_parity check, on what was written
    assert (parity.check_name, parity.passed) == ("trainer_parity", True)
    assert f"mix prompts.jsonl {train.height}/{train.height} identical" in parity.description


def test_without_specforge_installed_parity_says_not_verified_and_the_export_goes_on(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a plain `pip install` of the project (SpecForge comes only from the Makefile's `--no-deps`
    line) got a training_mix failing its blocking trainer_parity. The package made absent the way Python
    reports an uninstalled one (None in sys.modules: ModuleNotFoundError); test_fresh_install.py installs
    a venv from pyproject.toml alone for real."""
    for module in ("specforge", "specforge.data", "specforge.data.prompt_builder"):
        monkeypatch.setitem(sys.modules, module, None)
    result = run(gate.instance, gate.defs["b9_gate"], "training_mix")
    assert result.success and (gate.root / layout.mix()).is_file()  # the export is written, not blocked
    [parity] = result.get_asset_check_evaluations()
    assert (parity.check_name, parity.passed, parity.severity) == ("trainer_parity", False, dg.AssetCheckSeverity.WARN)
    assert parity.description.startswith("trainer_parity not verified: SpecForge's data modules are not installed")
    assert "pip install --no-deps specforge==0.2.0" in parity.description


def test_training_mix_with_no_shard_passing_fails_with_one_line(gate: Gate) -> None:
    result = run(gate.instance, gate.defs["b9_none"], "training_mix")
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = failure.step_failure_data.user_failure_data.description
    assert message.startswith("training_mix: no validated shard passed every blocking check (1 left out, ")
    assert "b9_none 00000: empty_response failed" in message and "\n" not in message
    assert not (gate.root / layout.mix()).exists()  # no stale mix stays


def test_after_a_range_run_the_export_takes_the_shards_it_passed_and_leaves_out_those_it_failed(gate: Gate) -> None:
    result = run(gate.instance, gate.defs["b9_range"], "training_mix")
    assert result.success
    train = pl.read_parquet(gate.root / layout.export_file("b9_range", layout.TRAIN_FILE))
    assert set(train["prompt_id"].str.slice(0, 5)) == {"00000", "00002"}
    table = result.asset_materializations_for_node("training_mix")[0].metadata["excluded"].value
    assert "| b9_range | 00001 | empty_response failed in run " in table and "00000" not in table


def test_a_shard_rewritten_after_its_checks_passed_is_left_out(tmp_path: Path) -> None:
    """A validation run that stopped part-way (killed, or failed on a later partition) leaves a quality record
    of new bytes its IO manager never stored, or a shard rewritten by hand: the stored bytes are not those the
    checks judged. Old main exported them; now the export hashes what it reads against the record's digest."""
    ds, store = spec("b9_stopped", 2), ShardStore(str(tmp_path))
    defs = definitions(ds, tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        for key in ("00000", "00001"):
            store.write_shard(ds.name, ds.name, key, shard_frame(ds.name, key, 0.0))
            assert run(instance, defs, f"{ds.name}_validated", key).success
        store.write_shard(ds.name, ds.name, "00000", shard_frame(ds.name, "00000", 0.0).head(40))
        generations = StoredShards(store, ds.name, ds.name, ["00000"])
        validation.validate(ds, store, generations, log=lambda _: None)  # the stopped run: record, no shard stored
        result = run(instance, defs, "training_mix")
    assert result.success
    train = pl.read_parquet(tmp_path / layout.export_file(ds.name, layout.TRAIN_FILE))
    assert set(train["prompt_id"].str.slice(0, 5)) == {"00001"}
    table = result.asset_materializations_for_node("training_mix")[0].metadata["excluded"].value
    assert "| b9_stopped | 00000 | its bytes changed since its checks ran" in table
