"""What was written is what is read (issue 43, items 1-2): every file a stage stores has its digest recorded,
every later read checks it before anything uses the bytes, and a changed or lost generation shard is rebuilt
from the rows already paid for.

Each test is one of the issue's probes, run against the real stages (the fake OpenAI server answering, the demo
model capturing) and, for the export's admission, a real Dagster instance. On the code before the digest
discipline each of them fails: the changed bytes were used as if whole, and a lost shard was paid for again.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest
import torch

from eagle_data import layout
from eagle_data.catalog import DatasetSpec, load_catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.drafter import verify
from eagle_data.drafter.settings import CaptureSettings, Decontamination
from eagle_data.engines import make_engine
from eagle_data.exports import Admission
from eagle_data.exports.check import check_exports
from eagle_data.exports.settings import ExportSettings
from eagle_data.quality.decontam import benchmark_index
from eagle_data.runner import RunnerSettings
from eagle_data.stages.decontamination import decontamination_report
from eagle_data.stages.export import export
from eagle_data.stages.hidden_states import verify_stored, write_hidden_states
from eagle_data.standins.openai_fake import FakeOpenAI, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.storage.shards import write_shards
from eagle_data.types import UserError
from eagle_data_tests import fixtures_stages as stage
from eagle_data_tests.fixtures_exports import fixture_specs, validated_shard
from eagle_data_tests.integration.test_drafter_capture import mix_frame, write_mix
from eagle_data_tests.integration.test_exports_defs import definitions, run, shard_frame
from eagle_data_tests.integration.test_exports_defs import spec as gate_spec

KEYS = ["00000", "00001"]
REPAIR = "`dagster asset materialize -m eagle_data.definitions --select {}`"  # the command each line ends with
CAPTURE = CaptureSettings(formats=("specforge-eagle3",), shard_rows=8, batch_tokens=160, dtype="fp32")


@dataclass
class Generated:
    """Two generation shards of 20 prompts, stored as a run stores them (on a folder, then on moto's S3 server),
    and the server that answered."""

    spec: DatasetSpec
    store: ShardStore
    server: FakeOpenAI

    def generate(self) -> None:
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{self.server.port}/v1", model="qwen/qwen3-8b",
                             max_tokens=200)  # fmt: skip
        stage.generate(self.spec, self.store, KEYS, engine, log=lambda _: None,
                       settings=RunnerSettings(progress_bar=False))  # fmt: skip

    def key(self, partition: str) -> str:
        return layout.shard(self.spec.name, self.spec.name, partition)

    def damage(self, partition: str, how: str) -> None:
        """Half its rows (a valid parquet file), torn (its footer cut), or deleted."""
        key = self.key(partition)
        if how == "deleted":
            self.store.delete(key)
        elif how == "torn":
            self.store.write_bytes(key, self.store.read_bytes(key)[:-200])
        else:
            frame = self.store.read_frame(key)
            self.store.write_frame(key, frame.head(frame.height // 2))


@pytest.fixture
def generated(server: FakeOpenAI, store: ShardStore) -> Iterator[Generated]:
    spec = spec_for_tests(target="qwen3-test")
    write_shards(store, spec.name, layout.prompts_asset(spec.name), prompt_shards(2, 20))
    done = Generated(spec, store, server)
    done.generate()
    yield done


def half_rows(path: Path) -> None:
    """Rewrite a shard as a valid parquet file holding its first half of rows."""
    frame = pl.read_parquet(path)
    frame.head(frame.height // 2).write_parquet(path)


def test_validation_refuses_a_generation_shard_rewritten_with_half_its_rows(generated: Generated) -> None:
    """Probe: a generation shard rewritten as valid parquet with half its rows validated as {'pass': 10}."""
    spec, store = generated.spec, generated.store
    generated.damage("00000", "half_rows")
    with pytest.raises(UserError) as refused:
        stage.validate(spec, store, KEYS, log=lambda _: None)
    line = str(refused.value)
    assert line.startswith(f"{store.uri(generated.key('00000'))} changed since it was written (sha256 ")
    assert " bytes recorded, " in line and "\n" not in line  # what changed: both digests and both sizes
    assert line.endswith(REPAIR.format(f"{spec.name} --partition 00000"))
    assert not store.exists(layout.quality_record(spec.name, "00000"))  # nothing downstream used it
    assert not store.shard_exists(spec.name, layout.validated_asset(spec.name), "00000")


@pytest.mark.parametrize("damage", ["half_rows", "torn", "deleted"])
def test_a_changed_or_lost_generation_shard_is_rebuilt_without_paying(generated: Generated, damage: str) -> None:
    """Probe: a corrupted stored generation shard was paid for again in full (the turn log was dropped once the
    shard was stored). Re-materializing the partition now rebuilds it from the kept rows: 0 requests."""
    spec, store = generated.spec, generated.store
    whole = store.read_frame(generated.key("00001"))
    paid = generated.server.received
    generated.damage("00001", damage)
    generated.generate()
    assert generated.server.received == paid  # nothing asked again
    rebuilt = store.read_frame(generated.key("00001"))
    assert rebuilt.height == whole.height == 20
    assert sorted(rebuilt["content"].to_list()) == sorted(whole["content"].to_list())
    done = stage.validate(spec, store, KEYS, log=lambda _: None)  # and the next stage reads it as written
    assert sum(done.rows.values()) == 40


def test_the_decontamination_check_refuses_a_validated_shard_changed_since_validation(generated: Generated) -> None:
    """The check judged after validation reads the bytes validation stored (its quality record's digest), or
    says in one line that they changed, instead of recording a verdict on other rows."""
    spec, store = generated.spec, generated.store
    stage.validate(spec, store, KEYS, log=lambda _: None)
    key = layout.shard(spec.name, layout.validated_asset(spec.name), "00001")
    store.write_frame(key, store.read_frame(key).head(5))
    with pytest.raises(UserError) as refused:
        decontamination_report(spec.name, store, KEYS, benchmark_index(Decontamination())[0])
    assert str(refused.value).startswith(f"{store.uri(key)} changed since it was written (sha256 ")
    assert str(refused.value).endswith(REPAIR.format(f"{spec.name}_validated --partition 00001"))


def test_re_materializing_a_changed_generation_partition_in_dagster_sends_no_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same repair through the assets and the shard IO manager: `dagster asset materialize --select
    b7_sharegpt --partition 00001`, as the refusal line says, after the stored shard lost half its rows."""
    server = FakeOpenAI()
    server.start()
    monkeypatch.setenv("EAGLE_DATA_ENGINE", "openai")
    monkeypatch.setenv("EAGLE_DATA_BASE_URL", f"http://127.0.0.1:{server.port}/v1")
    spec = load_catalog(profile="demo")["b7_sharegpt"].model_copy(update={"target": "qwen3-test"})
    resources = {**shard_resources(StorageResource(root=str(tmp_path))),
                 "engine": EngineResource(kind="openai", model="m", api_key_env="")}  # fmt: skip
    assets = build_dataset_assets(spec)
    generation = dg.AssetSelection.assets(layout.prompts_asset(spec.name), spec.name)
    try:
        with dg.DagsterInstance.ephemeral() as instance:
            for key in KEYS:
                assert dg.materialize(assets, selection=generation, partition_key=key, resources=resources,
                                      instance=instance).success  # fmt: skip
            paid, path = server.received, tmp_path / layout.shard(spec.name, spec.name, "00001")
            whole = pl.read_parquet(path)
            half_rows(path)
            again = dg.AssetSelection.assets(spec.name)
            assert dg.materialize(assets, selection=again, partition_key="00001", resources=resources,
                                  instance=instance).success  # fmt: skip
    finally:
        server.stop()
    assert paid > 0 and server.received == paid
    assert pl.read_parquet(path).select("prompt_id", "content").equals(whole.select("prompt_id", "content"))


def test_capture_refuses_an_edited_mix(specs: list[DatasetSpec], demo_model: Path, tmp_path: Path) -> None:
    """Probe: an edited mix.parquet was captured with every check green."""
    spec, store = exported_mix(tmp_path)
    path = tmp_path / layout.mix()
    mix = pl.read_parquet(path)
    mix.with_columns(input_ids=pl.col("input_ids").list.reverse()).write_parquet(path)  # same rows, other tokens
    with pytest.raises(UserError) as refused:
        write_hidden_states([spec], store, ["00000"], CAPTURE, str(demo_model), "cpu", lambda _: None)
    line = str(refused.value)
    assert line.startswith(f"{path} changed since it was written (sha256 ") and "\n" not in line
    assert line.endswith(REPAIR.format("training_mix"))
    assert not store.list(layout.capture_dir(""))  # nothing captured from it


def test_trainer_parity_refuses_a_trainer_file_edited_after_the_export(tmp_path: Path) -> None:
    """An exported file is read by the trainer's own code only once it is the file the export wrote: an edit
    that keeps the rows loadable fails the check as `not_loaded`, with the line naming it, instead of being
    compared as if the export had written it."""
    spec, store = exported_mix(tmp_path)
    path = tmp_path / layout.mix_file("prompts.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # the last row dropped: what the trainer loads is still consistent
    report = check_exports(store, [spec], ExportSettings(parity_rows=0))
    [failure] = report.failures
    assert failure.startswith(f"mix prompts.jsonl: not_loaded 1 ({path} changed since it was written (sha256 ")
    assert failure.endswith(REPAIR.format("training_mix") + ")") and "\n" not in failure


def exported_mix(root: Path) -> tuple[DatasetSpec, ShardStore]:
    """A 12-row validated shard of the b93_gamma fixture exported as the mix."""
    spec, store = fixture_specs()[2], ShardStore(str(root))
    store.write_shard(spec.name, layout.validated_asset(spec.name), "00000", validated_shard(spec.name, 0, rows=12))
    export([spec], store, {spec.name: Admission(("00000",))}, seed=0, log=lambda _: None)
    return spec, store


@pytest.fixture(scope="module")
def specs() -> list[DatasetSpec]:
    """The demo catalog's datasets, tokenized for the target whose vocabulary ships with the package."""
    return [spec.model_copy(update={"target": "qwen3-test"}) for spec in load_catalog(profile="demo").values()]


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, specs: list[DatasetSpec], demo_model: Path) -> Path:
    """An 8-row mix captured in one shard (its first verification records its files' digests)."""
    root = tmp_path_factory.mktemp("captured")
    store = write_mix(root, mix_frame(specs[0].name, rows=8))
    _, shards = write_hidden_states(specs, store, ["00000"], CAPTURE, str(demo_model), "cpu", lambda _: None)
    assert all(shards["00000"].found.passed(name) for name in verify.CHECKS)
    return root


def rescaled_copy(captured: Path, tmp_path: Path) -> tuple[ShardStore, Path]:
    """A copy of the capture with one row's file, outside the seeded re-capture sample, rewritten with its
    values x1.5 (a valid file: only its digest tells)."""
    root = tmp_path / "copy"
    shutil.copytree(captured, root)
    picked = set(random.Random(f"{CAPTURE.seed}-00000").sample(range(8), CAPTURE.recapture_rows))
    row = min(set(range(8)) - picked)
    [path] = root.rglob(f"specforge-eagle3/*/data_{row}.ckpt")
    tensors: dict[str, Any] = torch.load(path, weights_only=True)
    torch.save({k: v * 1.5 if v.is_floating_point() else v for k, v in tensors.items()}, path)
    return ShardStore(str(root)), path


def test_a_checks_only_run_refuses_a_hidden_state_file_rescaled_after_capture(
    captured: Path, specs: list[DatasetSpec], demo_model: Path, tmp_path: Path
) -> None:
    """Probe: a hidden-state file rewritten with its values x1.5 passed the checks-only run."""
    store, path = rescaled_copy(captured, tmp_path)
    found = verify_stored(specs, store, ["00000"], CAPTURE, str(demo_model), "cpu", lambda _: None)["00000"]
    assert not found.passed(verify.IDS) and not found.data_ok()
    line = found.line(verify.IDS)
    assert line.startswith(f"shard 00000: {path} changed since it was written (sha256 ") and "\n" not in line
    assert line.endswith(REPAIR.format("hidden_states --partition 00000"))


def test_the_next_capture_run_refuses_a_rescaled_hidden_state_file_then_captures_it_again(
    captured: Path, specs: list[DatasetSpec], demo_model: Path, tmp_path: Path
) -> None:
    """Probe: the next capture run skipped the shard whose file was rescaled, its checks green."""
    store, path = rescaled_copy(captured, tmp_path)
    _, refused = write_hidden_states(specs, store, ["00000"], CAPTURE, str(demo_model), "cpu", lambda _: None)
    assert refused["00000"].figures["captured"] is False and not refused["00000"].found.passed(verify.IDS)
    assert str(path) in refused["00000"].found.line(verify.IDS)
    _, again = write_hidden_states(specs, store, ["00000"], CAPTURE, str(demo_model), "cpu", lambda _: None)
    assert again["00000"].figures["captured"] is True  # its record was withdrawn: captured afresh
    assert all(again["00000"].found.passed(name) for name in verify.CHECKS)


def test_admission_reads_storage_only(tmp_path: Path) -> None:
    """The export's gate with the Dagster event log unavailable to it: the shards were validated and checked
    by another instance (another deployment's database, or one wiped), and the export still takes exactly the
    shards whose stored outcomes passed on the bytes on storage."""
    ds, store = gate_spec("b9_apart", 2), ShardStore(str(tmp_path))
    defs = definitions(ds, tmp_path)
    with dg.DagsterInstance.ephemeral() as checked:
        for key, share in (("00000", 0.0), ("00001", 0.87)):
            store.write_shard(ds.name, ds.name, key, shard_frame(ds.name, key, share))
            run(checked, defs, f"{ds.name}_validated", key)
    with dg.DagsterInstance.ephemeral() as elsewhere:  # knows no run, materialization or evaluation
        result = run(elsewhere, defs, "training_mix")
    assert result.success
    train = pl.read_parquet(tmp_path / layout.export_file(ds.name, layout.TRAIN_FILE))
    assert set(train["prompt_id"].str.slice(0, 5)) == {"00000"}
    table = result.asset_materializations_for_node("training_mix")[0].metadata["excluded"].value
    assert f"| {ds.name} | 00001 | empty_response failed in run " in table
