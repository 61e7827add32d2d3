"""A torn or garbled validated shard is named as unreadable, with the command that moves it aside (#34)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from eagle_data import exports, layout
from eagle_data.exports import Admission
from eagle_data.stages.export import export
from eagle_data.storage import ShardStore
from eagle_data.storage.digests import FileDigest
from eagle_data_tests.fixtures_exports import write_fixture


def torn(data: bytes) -> bytes:
    return data[: len(data) // 2]


def garbled(data: bytes) -> bytes:
    return data[:-12] + b"\xff" * 12  # the footer's length and its PAR1 magic overwritten


@pytest.mark.parametrize("damage", [torn, garbled])
def test_a_damaged_validated_shard_is_left_out_as_unreadable_with_its_mv_line(tmp_path: Path, damage) -> None:
    """Old code compared digests first and blamed a validation run that stopped part-way, with no `mv` line."""
    store = ShardStore(str(tmp_path))
    spec = write_fixture(store)[1]  # b92_beta: shards 00000..00002
    asset = layout.validated_asset(spec.name)
    judged = {key: FileDigest.of(store.shard_bytes(spec.name, asset, key)) for key in ("00000", "00001")}
    path = tmp_path / store.shard_key(spec.name, asset, "00001")
    path.write_bytes(damage(path.read_bytes()))
    lines: list[str] = []
    figures = export([spec], store, {spec.name: Admission(("00000", "00001"), digests=judged)}, seed=0,
                              log=lines.append)  # fmt: skip
    train = pl.read_parquet(tmp_path / layout.export_file(spec.name, layout.TRAIN_FILE))
    assert set(train["prompt_id"].str.slice(9, 5)) == {"00000"} and figures[f"{spec.name}_shards"] == 1
    [line] = [line for line in lines if line.startswith("WARNING b92_beta shard 00001 left out")]
    assert f"{path} is not a readable parquet file" in line and f"`mv {path} {path}.corrupt`" in line
    assert "bytes changed" not in line and "\n" not in line
    assert "| b92_beta | 00001 |" in figures["excluded"] and "not a readable parquet file" in figures["excluded"]


def test_an_export_whose_only_shard_is_torn_fails_naming_it_not_the_rows(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    spec = write_fixture(store)[1]
    path = tmp_path / store.shard_key(spec.name, layout.validated_asset(spec.name), "00001")
    path.write_bytes(torn(path.read_bytes()))
    with pytest.raises(exports.ExportError) as err:
        export([spec], store, {spec.name: Admission(("00001",))}, seed=0)
    message = str(err.value)
    assert "e.g. b92_beta 00001: " in message and f"`mv {path} {path}.corrupt`" in message
    assert "hold no row fit for training" not in message and "\n" not in message
