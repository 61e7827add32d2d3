"""Exports: the trainer JSONL files and training parquet load back with json/polars; mixes are weighted and
reproducible; the streaming export writes what the in-memory one wrote; no zero-mask row ever leaves; only
admitted shards."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle_data import layout, provenance
from eagle_data.catalog import Checks, Generation
from eagle_data.exports import (
    Admission,
    ExportError,
    exportable,
    plan_mix,
    to_training_parquet,
    verify,
    write_mix,
)
from eagle_data.exports.formats import to_specforge_text
from eagle_data.stages.export import export
from eagle_data.storage import ShardStore
from eagle_data.storage.digests import FileDigest
from eagle_data.storage.shards import shards_written
from eagle_data.targets import build_training_rows, load_target
from eagle_data.targets.rows import MESSAGE_DTYPE
from eagle_data_tests.fixtures_exports import (
    FIXTURE_DATASETS,
    export_digests,
    fixture_specs,
    validated_shard,
    write_fixture,
)

CONVERSATIONS = [
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning": "Add them."}],
    [
        {"role": "system", "content": "Réponds en français."},
        {"role": "user", "content": "Bonjour « ça va » ?"},
        {"role": "assistant", "content": "Salut ! 你好", "reasoning": ""},
    ],
    [{"role": "user", "content": "Write code."}, {"role": "assistant", "content": "print(1)", "reasoning": "Easy."}],
]


@pytest.fixture(scope="session")
def validated() -> pl.DataFrame:
    """A {ds}_validated-shaped frame: build_training_rows output plus the quality room's verdict."""
    gens = pl.DataFrame(
        {
            "prompt_id": ["a", "b", "c"],
            "dataset": "b7_sharegpt",
            "status": "ok",
            "finish_reason": "stop",
            "content": [c[-1]["content"] for c in CONVERSATIONS],
            "reasoning": [c[-1]["reasoning"] for c in CONVERSATIONS],
            "completion_tokens": [4, 8, 6],
            "messages": pl.Series(CONVERSATIONS, dtype=pl.List(MESSAGE_DTYPE)),
        }
    )
    rows = build_training_rows(load_target("qwen3-test"), gens, thinking=True)
    return rows.with_columns(verdict=pl.Series(["pass", "pass", "too_short"]))


GOLDEN = Path(__file__).parents[1] / "golden" / "exports_5k.json"
# a fixture dataset judging as the `validated` rows were: any loss-mask sum, reasoning not required
LENIENT = fixture_specs()[0].model_copy(
    update={"checks": Checks(min_loss_tokens=0), "generation": Generation(thinking=False)}
)


def test_specforge_text_jsonl_loads_with_json_and_polars(validated: pl.DataFrame) -> None:
    data = to_specforge_text(exportable(validated, LENIENT)[0])
    records = [json.loads(line) for line in data.decode().splitlines()]
    assert len(records) == pl.read_ndjson(io.BytesIO(data)).height == 2  # the passing rows
    assert records[0] == {
        "id": "a",
        "conversations": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        ],
    }
    assert records[1]["conversations"][1] == {"role": "user", "content": "Bonjour « ça va » ?"}
    assert records[1]["conversations"][2]["reasoning_content"] == ""


def test_training_parquet_round_trips_ids_and_masks(validated: pl.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    to_training_parquet(exportable(validated, LENIENT)[0]).write_parquet(path)
    back = pl.read_parquet(path)
    assert back.columns == ["prompt_id", "dataset", "input_ids", "loss_mask", *provenance.COLUMNS]
    assert back.schema["input_ids"] == pl.List(pl.Int32) and back.schema["loss_mask"] == pl.List(pl.UInt8)
    ok = validated.filter(pl.col("verdict") == "pass")
    assert back.height == ok.height == 2
    assert back["input_ids"].to_list() == ok["input_ids"].to_list()
    assert back["loss_mask"].list.sum().to_list() == ok["loss_tokens"].to_list()


def numbered(name: str, n: int) -> pl.DataFrame:
    ids = pl.Series([[i] for i in range(n)], dtype=pl.List(pl.Int32))
    masks = pl.Series([[1]] * n, dtype=pl.List(pl.UInt8))
    return pl.DataFrame(
        {"prompt_id": [f"{name}{i}" for i in range(n)], "dataset": name, "input_ids": ids, "loss_mask": masks}
    )


def mix(tmp_path: Path, frames: dict[str, pl.DataFrame], weights: dict[str, float], seed: int, bucket_rows: int = 7):
    """The streaming mix of in-memory frames, read back (small buckets: the spill path is taken)."""
    folder = tmp_path / f"mix-{len(os.listdir(tmp_path))}"
    (folder / "spill").mkdir(parents=True)
    for name, frame in frames.items():
        to_training_parquet(frame).write_parquet(folder / f"{name}.parquet")
    plan = plan_mix({name: frame.height for name, frame in frames.items()}, weights, seed)
    trains = {name: folder / f"{name}.parquet" for name in frames}
    write_mix(trains, plan, folder / "mix.parquet", folder / "spill", bucket_rows)
    return pl.read_parquet(folder / "mix.parquet")


def test_mix_follows_weights_and_is_reproducible(tmp_path: Path) -> None:
    frames = {"a": numbered("a", 10), "b": numbered("b", 40), "c": numbered("c", 5)}
    weights = {"a": 2.0, "b": 0.25, "c": 0.0}
    mixed = mix(tmp_path, frames, weights, seed=7)
    counts = dict(mixed.group_by("dataset").len().iter_rows())
    assert counts == {"a": 20, "b": 10}
    assert mixed.filter(pl.col("dataset") == "a")["prompt_id"].value_counts()["count"].to_list() == [2] * 10
    assert mixed.equals(mix(tmp_path, frames, weights, seed=7, bucket_rows=1000))  # one bucket or many: same
    assert not mixed.equals(mix(tmp_path, frames, weights, seed=8))
    again = mix(tmp_path, {**frames, "d": numbered("d", 3)}, {**weights, "d": 1.0}, seed=7)
    b_rows = set(mixed.filter(pl.col("dataset") == "b")["prompt_id"])
    assert set(again.filter(pl.col("dataset") == "b")["prompt_id"]) == b_rows  # adding a dataset moves no other


def test_mix_names_datasets_without_a_weight() -> None:
    with pytest.raises(ValueError, match="no weight for b"):
        plan_mix({"a": 2, "b": 2}, {"a": 1.0}, seed=0)


def admit_all(store: ShardStore, specs: list) -> dict[str, Admission]:
    return {s.name: Admission(tuple(shards_written(store, s.name, f"{s.name}_validated"))) for s in specs}


@pytest.mark.parametrize(("seed", "bucket_rows"), [(0, None), (7, 1000)])
def test_streaming_export_writes_what_the_in_memory_export_wrote(tmp_path: Path, seed: int, bucket_rows: int | None):
    """Frozen from the export that concatenated every shard and shuffled the mix in memory (main before the
    streaming export): 5,000 rows in 10 shards of three datasets, weights 0.5 / 2.5 / 1. Same rows, ids,
    masks and JSONL bytes, and the mix in the same order, in one bucket or in six spilled buckets. (The JSONL
    digests were frozen again when rows gained their `target` provenance field; ids, masks and mix unchanged.)"""
    golden = json.loads(GOLDEN.read_text())[f"seed{seed}"]
    store = ShardStore(str(tmp_path))
    specs = write_fixture(store)
    figures = export(specs, store, admit_all(store, specs), seed=seed, bucket_rows=bucket_rows)
    assert export_digests(tmp_path, list(FIXTURE_DATASETS)) == golden
    assert figures["mix_rows"] == golden["mix"]["rows"] == 5244
    mixed = pl.read_parquet(tmp_path / layout.mix())
    assert mixed.columns == ["prompt_id", "dataset", "input_ids", "loss_mask", *provenance.COLUMNS]


def zero_mask_shard(dataset: str = "b93_gamma") -> pl.DataFrame:
    """Rows the verdicts keep but whose tokens must never reach a trainer (issue #10, case 1 and kin)."""
    shard = validated_shard(dataset, 0, rows=6)
    n = shard["num_tokens"].to_list()
    return shard.with_columns(
        verdict=pl.Series(["pass", "truncated", "truncated", "pass", "pass", "pass"]),
        loss_mask=pl.Series(
            [[0] * n[0], [0] * n[1], [1] * (n[2] - 1), None, [1] * n[4], [1] * n[5]], dtype=pl.List(pl.UInt8)
        ),
        structure_ok=pl.Series([True, True, True, True, False, True]),
        target_error=pl.Series(["", "", "", "", "", ""]),
    )


def test_verify_refuses_every_row_unfit_for_training_whatever_its_verdict() -> None:
    kept, refused = verify(zero_mask_shard(), min_loss_tokens=16)
    assert kept["prompt_id"].to_list() == ["b93_gamma-00000-0005"]
    assert refused == {"short_loss": 2, "length_mismatch": 2, "bad_structure": 1}


def test_export_never_writes_a_zero_mask_row(tmp_path: Path) -> None:
    """Old main exported every truncated row with a loss-mask sum of 0 (the verdict kept them)."""
    store = ShardStore(str(tmp_path))
    spec = write_fixture(store)[2]  # b93_gamma, mix weight 1
    store.write_shard(spec.name, f"{spec.name}_validated", "00000", zero_mask_shard())
    figures = export([spec], store, {spec.name: Admission(("00000",))}, seed=0)
    train = pl.read_parquet(tmp_path / layout.export_file(spec.name, layout.TRAIN_FILE))
    mixed = pl.read_parquet(tmp_path / layout.mix())
    assert train["prompt_id"].to_list() == mixed["prompt_id"].to_list() == ["b93_gamma-00000-0005"]
    assert figures[f"{spec.name}_refused_short_loss"] == 2 and figures[f"{spec.name}_refused_length_mismatch"] == 2


def test_export_reads_only_admitted_shards_and_names_the_others(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    spec = write_fixture(store)[1]  # b92_beta: shards 00000..00002
    export([spec], store, admit_all(store, [spec]), seed=0)
    lines: list[str] = []
    gate = {spec.name: Admission(("00000",), {"00001": "empty_response failed", "00002": "token_structure failed"})}
    figures = export([spec], store, gate, seed=0, log=lines.append)
    train = pl.read_parquet(tmp_path / layout.export_file(spec.name, layout.TRAIN_FILE))
    assert set(train["prompt_id"].str.slice(9, 5)) == {"00000"}
    assert figures["excluded_shards"] == 2
    assert "| b92_beta | 00001 | empty_response failed |" in figures["excluded"]
    assert any("b92_beta shard 00002 left out of the export: token_structure failed" in line for line in lines)


def test_export_with_nothing_to_take_fails_with_one_line_and_removes_the_stale_files(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    specs = write_fixture(store)
    export(specs, store, admit_all(store, specs), seed=0)
    gate = {"b91_alpha": Admission((), {"00003": "empty_response failed"})}
    with pytest.raises(ExportError) as caught:
        export(specs, store, gate, seed=0)
    message = str(caught.value)
    assert "\n" not in message and "no validated shard passed every blocking check" in message
    assert "b91_alpha 00003: empty_response failed" in message
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and ("export" in p.parts or p.name == "mix.parquet")]


def test_export_to_s3_equals_the_local_export(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:
    import boto3

    local, remote = ShardStore(str(tmp_path)), ShardStore(f"s3://{s3_bucket}/eagle", lambda: boto3.client(
        "s3", endpoint_url=s3_endpoint))  # fmt: skip
    specs = write_fixture(local)[2:]
    key = "b93_gamma/b93_gamma_validated/00000.parquet"
    remote.write_bytes(key, local.read_bytes(key))
    outputs: dict[str, Any] = {}
    for store in (local, remote):
        export(specs, store, admit_all(store, specs), seed=3)
        outputs[store.root] = [
            store.read_bytes(k)
            for k in (layout.export_file("b93_gamma", "prompts.jsonl"), layout.mix_file("prompts.jsonl"))
        ] + [store.read_frame(k) for k in (layout.export_file("b93_gamma", layout.TRAIN_FILE), layout.mix())]
    first, second = outputs.values()
    assert first[:2] == second[:2] and first[2].equals(second[2]) and first[3].equals(second[3])


def test_export_judges_rows_again_under_todays_thresholds(tmp_path: Path) -> None:
    """Rows validated under a lenient lost_text_tolerance keep their stored verdict "pass" after the catalog
    tightened it; the export sets them aside all the same (old main exported them), and counts them."""
    store = ShardStore(str(tmp_path))
    spec = write_fixture(store)[2]  # b93_gamma, mix weight 1
    shard = validated_shard(spec.name, 0, rows=6).with_columns(
        verdict=pl.lit("pass"), status=pl.lit("ok"), finish_reason=pl.lit("stop"), eot_ok=pl.lit(True),
        completion_tokens=pl.lit(100, pl.Int64), reply_turns=pl.lit(1, pl.Int32),
        reply_tokens=pl.Series([50, 50, 100, 100, 100, 100], dtype=pl.Int32),  # the first two lost half their text
    )  # fmt: skip
    store.write_shard(spec.name, layout.validated_asset(spec.name), "00000", shard)
    figures = export([spec], store, {spec.name: Admission(("00000",))}, seed=0)
    train = pl.read_parquet(tmp_path / layout.export_file(spec.name, layout.TRAIN_FILE))
    assert train["prompt_id"].to_list() == shard["prompt_id"].to_list()[2:]
    assert figures[f"{spec.name}_refused_lost_text"] == 2


def test_export_leaves_out_an_admitted_shard_whose_bytes_are_not_the_judged_ones(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    spec = write_fixture(store)[1]  # b92_beta: shards 00000..00002
    asset = layout.validated_asset(spec.name)
    judged = {key: FileDigest.of(store.shard_bytes(spec.name, asset, key)) for key in ("00000", "00001")}
    store.write_shard(spec.name, asset, "00001", validated_shard(spec.name, 1, rows=20))  # rewritten since
    lines: list[str] = []
    figures = export([spec], store, {spec.name: Admission(("00000", "00001"), digests=judged)}, seed=0,
                              log=lines.append)  # fmt: skip
    train = pl.read_parquet(tmp_path / layout.export_file(spec.name, layout.TRAIN_FILE))
    assert set(train["prompt_id"].str.slice(9, 5)) == {"00000"} and figures[f"{spec.name}_shards"] == 1
    assert figures["excluded_shards"] == 1 and "| b92_beta | 00001 | its bytes changed" in figures["excluded"]
    assert any(line.startswith("WARNING b92_beta shard 00001 left out of the export: its bytes") for line in lines)
