"""Hidden-state plan: bytes within 2% of a hand calculation (and of the published 268 MB per 8K-token
sample of an 8B target), GPU-hours from the token count, and the asset's metadata and plan file."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from eagle_data import layout
from eagle_data.defs.drafter import build_drafter_assets
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter.hidden_states import mix_token_counts, plan
from eagle_data.drafter.settings import HiddenStateRecipe, load_drafter_settings
from eagle_data.storage import ShardStore

LENGTHS = {"b3_magicoder": [8192, 100, 3000], "b7_sharegpt": [512, 8192]}


@pytest.fixture
def mix_path(tmp_path: Path) -> Path:
    names = [name for name, lengths in LENGTHS.items() for _ in lengths]
    ids = [[7] * n for lengths in LENGTHS.values() for n in lengths]
    path = tmp_path / "mix.parquet"
    pl.DataFrame({"dataset": names, "input_ids": ids, "loss_mask": [[1] * len(i) for i in ids]}).write_parquet(
        path, row_group_size=2
    )
    return path


@pytest.mark.parametrize(
    ("dtype", "fmt", "per_token_by_hand"),
    [
        ("bf16", "specforge-eagle3", 4 * 4096 * 2 + 8 + 8),  # + int64 input_ids, loss_mask
        ("bf16", "speculators-eagle3", 4 * 4096 * 2 + 8 + 8 + 8),  # + int64 token_ids, the dataset's ids and mask
        ("fp8", "native", 4 * (4096 * 1 + 4) + 4 + 1),  # + int32 input_ids, uint8 loss_mask
    ],
)
def test_bytes_are_within_two_percent_of_a_hand_calculation(
    mix_path: Path, dtype: str, fmt: str, per_token_by_hand: int
) -> None:
    recipe = HiddenStateRecipe(captured_layers=4, hidden_size=4096, dtype=dtype, format=fmt, target_params_b=8.0)
    sized = plan(mix_token_counts(mix_path), recipe)
    tokens = sum(sum(lengths) for lengths in LENGTHS.values())
    assert sized.tokens == tokens and sized.samples == 5 and sized.longest_sample_tokens == 8192
    assert sized.total_bytes == pytest.approx(tokens * per_token_by_hand, rel=0.02)
    assert sized.per_dataset_bytes["b7_sharegpt"] == pytest.approx((512 + 8192) * per_token_by_hand, rel=0.02)
    if dtype == "bf16":  # the published figure: ~268 MB for one 8,192-token sample of an 8B target
        assert sized.longest_sample_bytes == pytest.approx(268e6, rel=0.02)
    # 2 FLOPs per parameter a token, at 40% of 989 TFLOP/s
    assert sized.gpu_hours == pytest.approx(2 * 8e9 * tokens / (989e12 * 0.4) / 3600, rel=1e-9)


def test_fp8_is_about_half_of_bf16(mix_path: Path) -> None:
    counts = mix_token_counts(mix_path)
    bf16 = plan(counts, HiddenStateRecipe(dtype="bf16")).total_bytes
    fp8 = plan(counts, HiddenStateRecipe(dtype="fp8", format="native")).total_bytes
    assert fp8 / bf16 == pytest.approx(0.5, abs=0.01)


def test_asset_reports_the_plan_as_metadata_and_writes_it(tmp_path: Path, mix_path: Path) -> None:
    store = ShardStore(str(tmp_path / "out"))
    store.write_bytes(layout.mix(), mix_path.read_bytes())
    assets = [a for a in build_drafter_assets([]) if a.key.to_user_string() == "hidden_state_plan"]
    result = dg.materialize(
        assets, resources={"storage": StorageResource(root=store.root)}, instance=dg.DagsterInstance.ephemeral()
    )
    meta = result.asset_materializations_for_node("hidden_state_plan")[0].metadata
    recipe = load_drafter_settings().hidden_states
    expected = plan(mix_token_counts(mix_path), recipe)
    assert meta["hs_total_bytes"].value == expected.total_bytes and meta["hs_tokens"].value == 19_996
    assert "| disk |" in meta["plan"].value and "b3_magicoder" in meta["plan"].value
    record = json.loads(store.read_bytes(layout.drafter_file("hidden_state_plan", "plan.json")))
    assert record["hs_total_bytes"] == expected.total_bytes and record["recipe"]["dtype"] == recipe.dtype
