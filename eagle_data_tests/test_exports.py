"""Exports: SpecForge JSONL and training parquet load back with json/polars; mixes are weighted and reproducible."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest

from eagle_data import provenance
from eagle_data.exports import mix, to_specforge_jsonl, to_training_parquet
from eagle_data.targets import build_training_rows, load_target
from eagle_data.targets.rows import MESSAGE_DTYPE

CONVERSATIONS = [
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning": "Add them."}],
    [
        {"role": "system", "content": "Réponds en français."},
        {"role": "user", "content": "Bonjour <|im_end|>"},
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
            "messages": pl.Series(CONVERSATIONS, dtype=pl.List(MESSAGE_DTYPE)),
        }
    )
    rows = build_training_rows(load_target("qwen3-test"), gens, thinking=True)
    return rows.with_columns(verdict=pl.Series(["pass", "pass", "too_short"]))


def test_specforge_jsonl_loads_with_json_and_polars(validated: pl.DataFrame) -> None:
    data = to_specforge_jsonl(validated)
    records = [json.loads(line) for line in data.decode().splitlines()]
    assert len(records) == pl.read_ndjson(io.BytesIO(data)).height == 2  # the passing rows
    assert records[0] == {
        "id": "a",
        "conversations": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning": "Add them."},
        ],
    }
    assert records[1]["conversations"][1] == {"role": "user", "content": "Bonjour <|im_end|>"}
    assert records[1]["conversations"][2]["reasoning"] == ""


def test_training_parquet_round_trips_ids_and_masks(validated: pl.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    to_training_parquet(validated).write_parquet(path)
    back = pl.read_parquet(path)
    assert back.columns == ["prompt_id", "dataset", "input_ids", "loss_mask", *provenance.COLUMNS]
    assert back.schema["input_ids"] == pl.List(pl.Int32) and back.schema["loss_mask"] == pl.List(pl.UInt8)
    ok = validated.filter(pl.col("verdict") == "pass")
    assert back.height == ok.height == 2
    assert back["input_ids"].to_list() == ok["input_ids"].to_list()
    assert back["loss_mask"].list.sum().to_list() == ok["loss_tokens"].to_list()


def numbered(name: str, n: int) -> pl.DataFrame:
    return pl.DataFrame({"prompt_id": [f"{name}{i}" for i in range(n)], "dataset": name})


def test_mix_follows_weights_and_is_reproducible() -> None:
    frames = {"a": numbered("a", 10), "b": numbered("b", 40), "c": numbered("c", 5)}
    weights = {"a": 2.0, "b": 0.25, "c": 0.0}
    mixed = mix(frames, weights, seed=7)
    counts = dict(mixed.group_by("dataset").len().iter_rows())
    assert counts == {"a": 20, "b": 10}
    assert mixed.filter(pl.col("dataset") == "a")["prompt_id"].value_counts()["count"].to_list() == [2] * 10
    assert mixed.equals(mix(frames, weights, seed=7))
    assert not mixed.equals(mix(frames, weights, seed=8))
    again = mix({**frames, "d": numbered("d", 3)}, {**weights, "d": 1.0}, seed=7)
    b_rows = set(mixed.filter(pl.col("dataset") == "b")["prompt_id"])
    assert set(again.filter(pl.col("dataset") == "b")["prompt_id"]) == b_rows  # adding a dataset moves no other


def test_mix_names_datasets_without_a_weight() -> None:
    with pytest.raises(ValueError, match="no weight for b"):
        mix({"a": numbered("a", 2), "b": numbered("b", 2)}, {"a": 1.0}, seed=0)
