"""Hidden-state capture on the demo model: layer numbering checked against the model itself, each format
read with the loader its trainer uses, checks that fail on planted corruption, skip and resume."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from eagle_data import layout
from eagle_data.catalog import load_catalog
from eagle_data.drafter import formats, verify
from eagle_data.drafter.capture import FLOOR_REASONS, TransformersBackend, batches, capture_shard
from eagle_data.drafter.layers import LayerError, dflash_ids, eagle3_ids, engine_ids, resolve
from eagle_data.drafter.settings import CaptureSettings
from eagle_data.stages.hidden_states import write_hidden_states
from eagle_data.storage import ShardStore, StorageError

SETTINGS = CaptureSettings(
    formats=("specforge-eagle3", "modelopt", "native"), fp8=True, shard_rows=8, batch_tokens=160, dtype="fp32"
)


def mix_frame(dataset: str, rows: int = 14, seed: int = 0, target: str | None = None) -> pl.DataFrame:
    """Rows of 4-60 tokens, a prompt part (mask 0) then a reply part (mask 1); some have < 32 loss tokens; with
    `target`, each row names it, as the export's rows name the target validation resolved."""
    rng = random.Random(seed)
    ids, masks = [], []
    for _ in range(rows):
        prompt, reply = rng.randint(2, 10), rng.randint(2, 50)
        ids.append([rng.randrange(5, 150_000) for _ in range(prompt + reply)])
        masks.append([0] * prompt + [1] * reply)
    frame = pl.DataFrame(
        {"prompt_id": [f"p{i}" for i in range(rows)], "dataset": dataset, "input_ids": ids, "loss_mask": masks},
        schema_overrides={"input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8)},
    )
    return frame if target is None else frame.with_columns(target=pl.lit(target))


def write_mix(root: Path, frame: pl.DataFrame) -> ShardStore:
    store = ShardStore(str(root))
    store.write_frame(layout.mix(), frame)
    return store


@pytest.fixture(scope="module")
def specs() -> list[Any]:
    return [s.model_copy(update={"target": "demo"}) for s in load_catalog(profile="demo").values()]


@pytest.fixture(scope="module")
def backend(demo_model: Path) -> TransformersBackend:
    return TransformersBackend(demo_model, "cpu", "fp32")


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, specs: list[Any], demo_model: Path) -> dict[str, Any]:
    """A 14-row mix captured for three after-norm EAGLE-3 targets (native in fp8), in two shards of 8 rows."""
    root = tmp_path_factory.mktemp("capture")
    frame = mix_frame(specs[0].name)
    store = write_mix(root, frame)
    figures, shards = write_hidden_states(specs, store, ["00000", "00001"], SETTINGS, str(demo_model), "cpu", print)
    return {"root": root, "frame": frame, "figures": figures, "shards": shards}


def test_layer_presets_follow_specforge_and_engine_numbering() -> None:
    assert eagle3_ids(36) == [1, 17, 32]  # Qwen3-8B
    assert engine_ids(eagle3_ids(36)) == [2, 36 // 2, 36 - 3]  # SGLang/vLLM write the same layers
    assert dflash_ids(36, 5) == [1, 9, 17, 25, 33]  # SpecForge's Qwen3-8B DFlash config
    assert dflash_ids(64, 5) == [1, 16, 31, 46, 61]  # z-lab's Qwen3.6-27B
    two = resolve(CaptureSettings(), 2)  # the demo model: [1, 0, -2] clamped into 0..1, width kept
    assert (two.aux, two.last, two.clamped, two.count) == ((1, 0, 0), "after_norm", True, 4)
    assert not resolve(CaptureSettings(), 36).clamped
    assert resolve(CaptureSettings(formats=("specforge-dflash",)), 36).last is None
    with pytest.raises(LayerError, match=r"layers \[5\] are outside the target's decoder layers 0..1"):
        resolve(CaptureSettings(layers=(0, 5)), 2)


def test_specforge_numbering_captures_the_inputs_engines_name(tmp_path: Path, demo_model: Path) -> None:
    """On a random 8-layer Qwen3: the outputs of layers [1, N//2-1, N-4] captured here are the inputs of
    layers [2, N//2, N-3] (what SGLang and vLLM hook); the last state before/after the norm is the norm's
    input/output. On the 2-layer demo model: hidden_states[1] is layer 0's output."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "eight")
    rows = [np.arange(3, 40) % 500, np.arange(7, 20)]
    backend = TransformersBackend(tmp_path / "eight", "cpu", "fp32")
    inputs: dict[int, torch.Tensor] = {}
    norm_io: list[torch.Tensor] = []

    def layer_input(j: int) -> Any:
        return lambda _m, args, kwargs: inputs.__setitem__(j, args[0] if args else kwargs["hidden_states"])

    for last in ("after_norm", "before_norm"):
        plan = resolve(CaptureSettings(formats=("native",), last_state=last), 8)
        inputs.clear()
        norm_io.clear()
        hooks = [
            backend.model.layers[j].register_forward_pre_hook(layer_input(j), with_kwargs=True)
            for j in engine_ids(plan.aux)
        ]
        hooks.append(backend.model.norm.register_forward_hook(lambda _m, args, out: norm_io.extend([args[0], out])))
        states = backend.capture(rows[:1], plan)[0]
        for h in hooks:
            h.remove()
        assert plan.aux == (1, 3, 4) and engine_ids(plan.aux) == [2, 4, 5]
        for k, j in enumerate(engine_ids(plan.aux)):
            assert torch.equal(states[:, k], inputs[j][0])
        assert torch.equal(states[:, 3], norm_io[0 if last == "before_norm" else 1][0])
        batched = backend.capture(rows, plan)  # right padding: a row's states do not depend on its neighbour
        assert torch.allclose(batched[0], states, atol=1e-5) and batched[1].shape == (13, 4, 32)
    demo = TransformersBackend(demo_model, "cpu", "fp32")
    outputs: list[torch.Tensor] = []
    hook = demo.model.layers[0].register_forward_hook(lambda _m, _a, out: outputs.append(out))
    states = demo.capture(rows[1:], resolve(CaptureSettings(layers=(0,), last_state="none", formats=("native",)), 2))
    hook.remove()
    assert torch.equal(states[0][:, 0], outputs[0][0])


def test_fp8_round_trip_stays_within_its_stated_bound() -> None:
    torch.manual_seed(0)
    x = torch.randn(50, 4, 64) * torch.logspace(-3, 3, 64)  # six decades within each token and layer
    values, scale = formats.to_fp8(x)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (50, 4)
    error = (formats.from_fp8(values, scale) - x).abs()
    bound = formats.fp8_bound(x, scale)
    assert bool((error <= bound).all())
    assert float((error / bound).max()) > 0.5  # the bound is near what fp8 loses, not slack


def test_batches_cover_every_row_once_within_the_token_budget() -> None:
    lengths = [5, 50, 12, 300, 7, 49, 50]
    groups = batches(lengths, 100)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 100
    assert groups[0] == [3] and batches(lengths, 100) == groups  # the long row alone; deterministic


def test_each_format_loads_with_its_trainers_loader(captured: dict[str, Any]) -> None:
    folder = Path(captured["figures"]["path"])
    frame, hidden = captured["frame"], 64
    rows = {i: (ids, mask) for i, (ids, mask) in enumerate(frame.select("input_ids", "loss_mask").iter_rows())}
    for row, (ids, mask) in rows.items():
        seq = len(ids)
        group = row // 2000 * 2000
        sf_path = folder / "specforge-eagle3" / f"rows_{group}-{group + 2000}" / f"data_{row}.ckpt"
        sf = torch.load(sf_path, weights_only=True)
        assert sf["input_ids"].tolist() == ids and sf["loss_mask"].tolist() == mask
        assert sf["hidden_state"].shape == (1, seq, hidden) and sf["aux_hidden_state"].shape == (1, seq, 3 * hidden)
        mo = torch.load(folder / "modelopt" / f"{row // 8:05d}" / f"{row}.pt", weights_only=True)
        assert mo["input_ids"].tolist() == ids and mo["hidden_states"].shape == (seq, hidden)  # no batch dimension
        assert torch.equal(mo["hidden_states"], sf["hidden_state"][0])  # the same last state
        assert torch.equal(mo["aux_hidden_states"], sf["aux_hidden_state"][0])
    seen = {}
    for shard in ("00000", "00001"):
        index = __import__("json").loads((folder / "native" / shard / "index.json").read_text())
        for entry in index["files"]:
            tensors = load_file(folder / "native" / shard / entry["file"])
            assert tensors["hidden_states"].dtype == torch.float8_e4m3fn
            assert tensors["scales"].shape == (*tensors["hidden_states"].shape[:2],)
            for row, prompt_id, start, length in entry["rows"]:
                seen[row] = tensors["input_ids"][start : start + length].tolist()
                assert prompt_id == f"p{row}"
    assert seen == {row: ids for row, (ids, _) in rows.items()}


def test_a_clean_capture_passes_every_check_and_records_provenance(captured: dict[str, Any]) -> None:
    shards, figures = captured["shards"], captured["figures"]
    for shard in shards.values():
        found = shard.found
        assert all(found.passed(name) for name in verify.CHECKS), {n: found.line(n) for n in verify.CHECKS}
        assert found.recaptured == SETTINGS.recapture_rows and found.bytes_error() <= 0.02
        assert shard.figures["captured"] is True and shard.figures["tokens_per_s"] > 0
    assert [shards[p].found.samples for p in ("00000", "00001")] == [3 * 8, 3 * 6]
    assert [shards[p].figures["captured_rows"] for p in ("00000", "00001")] == [8, 6] and figures["clamped"] is True
    record = __import__("json").loads(Path(figures["path"], "_shards", "00001.json").read_text())
    assert record["mix_rows"] == [8, 14] and len(record["checkpoint_sha256"]) == 64
    assert record["layers"]["aux_layers"] == [1, 0, 0] and record["layers"]["last_state"] == "after_norm"
    assert record["dtype"] == "fp32" and record["fp8"] is True and len(record["tokenizer_hash"]) == 64


def _corrupt_specforge_id(folder: Path) -> None:
    path = folder / "specforge-eagle3" / "rows_0-2000" / "data_3.ckpt"
    data = torch.load(path, weights_only=True)
    data["input_ids"][1] += 1
    torch.save(data, path)


def _plant_nan(folder: Path) -> None:
    path = folder / "modelopt" / "00000" / "2.pt"
    data = torch.load(path, weights_only=True)
    data["aux_hidden_states"][0, 0] = float("nan")
    torch.save(data, path)


def _truncate_native(folder: Path) -> None:
    path = folder / "native" / "00000" / "batch_00000.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


@pytest.mark.parametrize(
    ("plant", "failing"),
    [(_corrupt_specforge_id, verify.IDS), (_plant_nan, verify.FINITE), (_truncate_native, verify.IDS)],
)
def test_planted_corruption_fails_its_check(
    captured: dict[str, Any], backend: TransformersBackend, tmp_path: Path, plant: Any, failing: str
) -> None:
    root = tmp_path / "copy"
    shutil.copytree(captured["root"], root)
    folder = Path(captured["figures"]["path"].replace(str(captured["root"]), str(root)))
    plant(folder)
    store = ShardStore(str(root))
    record = __import__("json").loads((folder / "_shards" / "00000.json").read_text())
    frame = captured["frame"].head(8).with_row_index("row").cast({"row": pl.Int64})
    plan = resolve(SETTINGS, 2)
    folder_key = layout.capture_dir(captured["figures"]["capture_id"])
    found = verify.verify_shard(store, folder_key, record, frame, plan, backend, 8, 0)  # every row re-captured
    assert not found.passed(failing)
    assert found.line(failing).startswith("shard 00000: ")
    assert found.line(failing).endswith("re-materialize hidden_states partition 00000")
    if plant is _plant_nan:
        assert not found.passed(verify.RECAPTURE)  # the NaN row differs from its re-capture too
    if plant is _truncate_native:
        assert "native batch_00000.safetensors unreadable" in found.line(verify.IDS)


def test_rerun_skips_unchanged_shards_and_recaptures_a_changed_one(
    captured: dict[str, Any], specs: list[Any], demo_model: Path, tmp_path: Path
) -> None:
    root = tmp_path / "copy"
    shutil.copytree(captured["root"], root)
    store = ShardStore(str(root))
    _, again = write_hidden_states(specs, store, ["00000", "00001"], SETTINGS, str(demo_model), "cpu", print)
    assert [(s.figures["captured"], s.figures["batches_run"]) for s in again.values()] == [(False, 0), (False, 0)]
    assert all(s.found.passed(verify.IDS) for s in again.values())
    frame = captured["frame"]
    changed = frame.with_columns(
        input_ids=pl.when(pl.col("prompt_id") == "p9").then(pl.col("input_ids").list.reverse()).otherwise("input_ids")
    )
    store.write_frame(layout.mix(), changed)
    _, third = write_hidden_states(specs, store, ["00000", "00001"], SETTINGS, str(demo_model), "cpu", print)
    assert [s.figures["captured"] for s in third.values()] == [False, True]  # p9 is row 9, in shard 00001
    assert all(s.found.passed(verify.IDS) for s in third.values())


class Crashing:
    """The demo backend, dying on its `crash_at`-th forward pass (a killed run), and counting passes."""

    def __init__(self, inner: TransformersBackend, crash_at: int | None) -> None:
        self.inner, self.crash_at, self.calls = inner, crash_at, 0
        self.num_layers, self.hidden_size, self.vocab_size, self.dtype = (
            inner.num_layers, inner.hidden_size, inner.vocab_size, inner.dtype
        )  # fmt: skip

    def capture(self, rows: Any, plan: Any) -> list[Any]:
        self.calls += 1
        if self.calls == self.crash_at:
            raise KeyboardInterrupt("killed")
        return self.inner.capture(rows, plan)


def test_a_killed_capture_resumes_at_its_batch(backend: TransformersBackend, tmp_path: Path) -> None:
    frame = mix_frame("d", rows=8).with_row_index("row").cast({"row": pl.Int64})
    settings = SETTINGS.model_copy(update={"batch_tokens": 64})
    store, plan, provenance = ShardStore(str(tmp_path)), resolve(settings, 2), {"formats": list(settings.formats)}
    total = len(batches([len(i) for i in frame["input_ids"]], settings.batch_tokens))
    assert total >= 4
    dying = Crashing(backend, crash_at=3)
    with pytest.raises(KeyboardInterrupt):
        capture_shard(store, "cid", "00000", frame, provenance, dying, plan, settings)
    resumed = Crashing(backend, crash_at=None)
    result = capture_shard(store, "cid", "00000", frame, provenance, resumed, plan, settings)
    assert (result.batches_resumed, resumed.calls) == (2, total - 2)  # no finished batch is run again
    found = verify.verify_shard(store, layout.capture_dir("cid"), result.record, frame, plan, backend, 0, 0)
    assert found.passed(verify.IDS) and found.samples == 3 * 8


class DyingAfterFiles(ShardStore):
    """A real folder store whose process dies as it records batch `die_at`'s progress: that batch's files
    are on disk, its progress is not (the worst moment for a kill)."""

    def __init__(self, root: str, die_at: int) -> None:
        super().__init__(root)
        self.die_at, self.progress_writes = die_at, 0

    def write_bytes(self, key: str, data: bytes) -> str:
        if "/_progress/" in key:
            self.progress_writes += 1
            if self.progress_writes == self.die_at:
                raise KeyboardInterrupt("killed")
        return super().write_bytes(key, data)


def test_a_kill_between_a_batchs_files_and_its_progress_repeats_that_batch_only(
    backend: TransformersBackend, tmp_path: Path
) -> None:
    frame = mix_frame("d", rows=8).with_row_index("row").cast({"row": pl.Int64})
    settings = SETTINGS.model_copy(update={"batch_tokens": 64})
    plan, provenance = resolve(settings, 2), {"formats": list(settings.formats)}
    total = len(batches([len(i) for i in frame["input_ids"]], settings.batch_tokens))
    with pytest.raises(KeyboardInterrupt):
        capture_shard(
            DyingAfterFiles(str(tmp_path), die_at=3), "cid", "00000", frame, provenance, backend, plan, settings
        )
    counting = Crashing(backend, crash_at=None)
    result = capture_shard(ShardStore(str(tmp_path)), "cid", "00000", frame, provenance, counting, plan, settings)
    assert (result.batches_resumed, counting.calls) == (2, total - 2)  # batch 3 again: the one repeated batch
    found = verify.verify_shard(
        ShardStore(str(tmp_path)), layout.capture_dir("cid"), result.record, frame, plan, backend, 0, 0
    )
    assert found.passed(verify.IDS) and found.samples == 3 * 8


def test_a_refused_write_fails_in_one_line_naming_the_file_and_records_no_batch(
    backend: TransformersBackend, tmp_path: Path
) -> None:
    frame = mix_frame("d", rows=8).with_row_index("row").cast({"row": pl.Int64})
    settings = SETTINGS.model_copy(update={"batch_tokens": 64, "formats": ("specforge-eagle3",)})
    store, plan, provenance = ShardStore(str(tmp_path)), resolve(settings, 2), {"formats": ["specforge-eagle3"]}
    blocker = tmp_path / layout.capture_dir("cid") / "specforge-eagle3"  # a file where the rows' folder must go
    blocker.parent.mkdir(parents=True)
    blocker.write_bytes(b"")
    with pytest.raises(StorageError) as failed:
        capture_shard(store, "cid", "00000", frame, provenance, backend, plan, settings)
    message = str(failed.value)
    assert "\n" not in message and "a file is in the way" in message
    assert "/specforge-eagle3/rows_0-2000/data_" in message
    assert not store.exists(layout.capture_record("cid", "progress", "00000"))  # no batch recorded done
    blocker.unlink()
    counting = Crashing(backend, crash_at=None)
    result = capture_shard(store, "cid", "00000", frame, provenance, counting, plan, settings)
    assert (result.batches_resumed, result.record["captured_rows"]) == (0, 8)


def test_dflash_sets_aside_the_rows_specforge_refuses(backend: TransformersBackend, tmp_path: Path) -> None:
    """SpecForge's DFlash family needs two adjacent supervised tokens (since 2026-07-30), nothing more: a row
    supervising every other token is set aside, a row of two adjacent ones is kept."""
    frame = mix_frame("d", rows=8).with_row_index("row").cast({"row": pl.Int64})
    masks = frame["loss_mask"].to_list()
    masks[2] = [i % 2 for i in range(len(masks[2]))]  # supervised, never twice in a row
    masks[5] = [0] * (len(masks[5]) - 2) + [1, 1]  # the floor exactly
    frame = frame.with_columns(loss_mask=pl.Series(masks, dtype=pl.List(pl.UInt8)))
    settings = CaptureSettings(formats=("specforge-dflash",), shard_rows=8, dtype="fp32")
    plan = resolve(settings, 2)
    provenance = {"formats": ["specforge-dflash"]}
    result = capture_shard(ShardStore(str(tmp_path)), "cid", "00000", frame, provenance, backend, plan, settings)
    assert result.record["set_aside_rows"] == {"2": FLOOR_REASONS["consecutive"]}
    assert result.record["captured_rows"] == 7
    key = formats.row_key(layout.capture_dir("cid"), "specforge-dflash", "00000", 5, 4)
    data = torch.load(Path(tmp_path, key), weights_only=True)
    assert set(data) == {"input_ids", "loss_mask", "hidden_states"} and data["hidden_states"].shape[2] == 5 * 64
    assert not Path(tmp_path, formats.row_key(layout.capture_dir("cid"), "specforge-dflash", "00000", 2, 2)).exists()


def test_asset_materializes_on_the_demo_profile_and_its_checks_block_on_corruption(
    tmp_path: Path, specs: list[Any], demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from eagle_data.defs.drafter import CAPTURE_SHARDS, CaptureResource, build_drafter_assets, follow_the_mix
    from eagle_data.defs.resources import StorageResource

    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model))  # the mix's ids are the random Qwen model's
    monkeypatch.delenv("EAGLE_DATA_CAPTURE_CHECKPOINT", raising=False)
    write_mix(tmp_path, mix_frame(specs[0].name, rows=6))
    asset = next(a for a in build_drafter_assets(specs) if a.key.to_user_string() == "hidden_states")
    resources = {"storage": StorageResource(root=str(tmp_path)), "capture": CaptureResource(device="cpu")}
    instance = dg.DagsterInstance.ephemeral()
    assert follow_the_mix(instance, 6) == ["00000"]  # what training_mix does
    result = dg.materialize([asset], resources=resources, instance=instance, partition_key="00000")
    assert result.success
    meta = result.asset_materializations_for_node("hidden_states")[0].metadata
    assert meta["captured_rows"].value == 6 and meta["dtype"].value == "fp32"
    assert meta["formats"].value == ["specforge-eagle3"]
    evaluations = result.get_asset_check_evaluations()
    assert {e.check_name for e in evaluations} == set(verify.CHECKS) and all(e.passed for e in evaluations)
    digest = meta["shard_sha256"].value
    assert {(e.partition, e.metadata["shard_sha256"].value) for e in evaluations} == {("00000", digest)}
    _corrupt_specforge_id(Path(meta["path"].value))  # the re-run skips the unchanged shard, the checks still read it
    again = dg.materialize([asset], resources=resources, instance=instance, partition_key="00000", raise_on_error=False)
    assert not again.success
    failed = {e.check_name: e.description for e in again.get_asset_check_evaluations() if not e.passed}
    assert list(failed) == [verify.IDS] and failed[verify.IDS].startswith("shard 00000: 1 stored sample(s) missing")
    third = dg.materialize([asset], resources=resources, instance=instance, partition_key="00000")
    assert third.success  # the failed shard lost its record, so this run captured it again
    assert third.asset_materializations_for_node("hidden_states")[0].metadata["captured"].value is True
    instance.add_dynamic_partitions(CAPTURE_SHARDS.name, ["00003"])  # a key added by hand, past the mix's end
    past = dg.materialize([asset], resources=resources, instance=instance, partition_key="00003", raise_on_error=False)
    error = past.get_step_failure_events()[0].step_failure_data.error
    assert not past.success and "past the mix's 6 rows" in str(error)
