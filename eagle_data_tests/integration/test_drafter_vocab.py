"""Draft vocabulary: the mapping equals one built independently with collections.Counter (SpecForge's
convention, ties by id), loads with torch.load as tensors, and the asset caches by mix content."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import torch

from eagle_data import layout
from eagle_data.catalog import load_catalog
from eagle_data.defs.drafter import build_drafter_assets
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter import vocab
from eagle_data.stages.draft_vocab import write_draft_vocab
from eagle_data.storage import ShardStore
from eagle_data.targets import load_target

VOCAB_SIZE = 1_000


def mix_frame(rows: int = 300, seed: int = 0, vocab_size: int = VOCAB_SIZE) -> pl.DataFrame:
    """Rows of skewed ids (many ties in count) with a prompt part (mask 0) and a reply part (mask 1)."""
    rng = random.Random(seed)
    ids, masks = [], []
    for _ in range(rows):
        prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 20))]
        reply = [min(int(rng.paretovariate(0.8)) * 7, vocab_size - 1) for _ in range(rng.randint(1, 40))]
        ids.append(prompt + reply)
        masks.append([0] * len(prompt) + [1] * len(reply))
    return pl.DataFrame(
        {"prompt_id": [f"p{i}" for i in range(rows)], "dataset": "fixture", "input_ids": ids, "loss_mask": masks},
        schema_overrides={"input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8)},
    )


def counter_mapping(frame: pl.DataFrame, size: int, vocab_size: int) -> tuple[list[int], list[bool]]:
    """The convention written out with a Counter, independent of the module under test."""
    counts: Counter[int] = Counter()
    for ids, mask in zip(frame["input_ids"].to_list(), frame["loss_mask"].to_list(), strict=True):
        counts.update(t for t, m in zip(ids, mask, strict=True) if m == 1)
    for token in range(vocab_size):  # pad with the lowest unused ids at count 0
        if len(counts) >= size:
            break
        counts.setdefault(token, 0)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
    used = sorted(token for token, _ in top)
    used_set = set(used)
    return [u - i for i, u in enumerate(used)], [t in used_set for t in range(vocab_size)]


@pytest.fixture
def mix_path(tmp_path: Path) -> Path:
    path = tmp_path / "mix.parquet"
    mix_frame().write_parquet(path, row_group_size=64)  # several row groups: the count streams across them
    return path


@pytest.mark.parametrize("size", [50, 200])  # 50: top-N with ties cut; 200: more than occur, so padded
def test_mapping_equals_counter_convention_and_loads_as_tensors(mix_path: Path, tmp_path: Path, size: int) -> None:
    frame = pl.read_parquet(mix_path)
    counts = vocab.count_supervised(mix_path, VOCAB_SIZE)
    assert 50 < int((counts > 0).sum()) < 200  # the fixture exercises both branches
    path = tmp_path / f"vocab_{size}.pt"
    path.write_bytes(vocab.mapping_bytes(vocab.draft_vocab(counts, size)))
    loaded = torch.load(path, weights_only=True)
    d2t, t2d = counter_mapping(frame, size, VOCAB_SIZE)
    assert loaded["d2t"].dtype == torch.int64 and loaded["t2d"].dtype == torch.bool
    assert loaded["d2t"].tolist() == d2t
    assert loaded["t2d"].tolist() == t2d
    assert int(loaded["t2d"].sum()) == size
    assert (torch.arange(size) + loaded["d2t"]).tolist() == torch.nonzero(loaded["t2d"]).flatten().tolist()


def test_ties_are_broken_by_lower_id() -> None:
    counts = torch.zeros(10, dtype=torch.int64).numpy()
    counts[[7, 3, 5]] = 4  # three ids tie; a size of 2 keeps the two lowest
    counts[9] = 9
    assert vocab.select_draft_ids(counts, 3).tolist() == [3, 5, 9]


def test_coverage_is_share_of_supervised_tokens(mix_path: Path) -> None:
    counts = vocab.count_supervised(mix_path, VOCAB_SIZE)
    draft = vocab.draft_vocab(counts, 50)
    assert draft.coverage == pytest.approx(counts[draft.used].sum() / counts.sum())
    assert 0 < draft.coverage < 1
    assert vocab.draft_vocab(counts, 200).coverage == 1.0


def test_token_freq_file_round_trips_in_speculators_format(mix_path: Path) -> None:
    counts = vocab.count_supervised(mix_path, VOCAB_SIZE)
    data = vocab.token_freq_bytes(counts)
    freq = torch.load(__import__("io").BytesIO(data), weights_only=True)
    assert isinstance(freq, dict) and all(v > 0 for v in freq.values())
    assert sum(freq.values()) == counts.sum()
    assert (vocab.counts_from_token_freq(data, VOCAB_SIZE) == counts).all()


def test_ids_outside_the_target_vocabulary_fail_with_one_line(mix_path: Path) -> None:
    with pytest.raises(vocab.VocabError, match="outside the target vocabulary of 100"):
        vocab.count_supervised(mix_path, 100)


def test_asset_writes_catalog_sizes_and_reuses_the_count_cache(tmp_path: Path) -> None:
    specs = [s.model_copy(update={"target": "qwen3-test"}) for s in load_catalog(profile="").values()]
    store = ShardStore(str(tmp_path))
    frame = mix_frame(vocab_size=50_000).with_columns(dataset=pl.lit(specs[0].name))
    store.write_frame(layout.mix(), frame)
    resources = {"storage": StorageResource(root=str(tmp_path))}
    assets = [a for a in build_drafter_assets(specs) if a.key != dg.AssetKey(layout.HIDDEN_STATES_ASSET)]
    result = dg.materialize(assets, resources=resources, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    meta = result.asset_materializations_for_node("draft_vocab")[0].metadata
    target = load_target("qwen3-test")
    for size in (32_000, 64_000):  # the catalog's sizes
        path = Path(meta[f"mapping_{size}_path"].value)
        loaded = torch.load(path, weights_only=True)
        d2t, t2d = counter_mapping(frame, size, target.vocab_size)
        assert loaded["d2t"].tolist() == d2t and loaded["t2d"].tolist() == t2d
        assert meta[f"coverage_{size}"].value == 1.0  # fewer than 32k ids occur
    assert meta["counted"].value is True
    again = write_draft_vocab(specs, store, (32_000,), log=lambda _: None)
    assert again["counted"] is False and again["mix_hash"] == meta["mix_hash"].value
    store.write_frame(layout.mix(), frame.head(10))  # new content: a new cache entry, counted again
    assert write_draft_vocab(specs, store, (32_000,), log=lambda _: None)["counted"] is True


def test_mix_of_two_targets_is_refused(tmp_path: Path) -> None:
    specs = list(load_catalog(profile="").values())
    specs = [specs[0].model_copy(update={"target": "qwen3-test"}), specs[1].model_copy(update={"target": "kimi-test"})]
    store = ShardStore(str(tmp_path))
    frame = mix_frame(rows=4)
    store.write_frame(layout.mix(), frame.with_columns(dataset=pl.Series([specs[0].name, specs[1].name] * 2)))
    with pytest.raises(ValueError, match="2 targets"):
        write_draft_vocab(specs, store, (10,))


def test_a_mix_on_s3_is_downloaded_streaming_and_gives_the_same_mapping(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    import boto3

    specs = [s.model_copy(update={"target": "qwen3-test"}) for s in load_catalog(profile="").values()]
    frame = mix_frame(vocab_size=50_000).with_columns(dataset=pl.lit(specs[0].name))
    local, remote = ShardStore(str(tmp_path)), ShardStore(
        f"s3://{s3_bucket}/run", s3_client_factory=lambda: boto3.client("s3", endpoint_url=s3_endpoint)
    )
    for store in (local, remote):
        store.write_frame(layout.mix(), frame)
    on_disk = write_draft_vocab(specs, local, (100,), log=lambda _: None)
    on_s3 = write_draft_vocab(specs, remote, (100,), log=lambda _: None)
    assert on_s3["mix_hash"] == on_disk["mix_hash"] and on_s3["coverage_100"] == on_disk["coverage_100"]
    assert on_s3["mapping_100_path"].startswith(f"s3://{s3_bucket}/run/drafter/draft_vocab/")
    key = on_s3["mapping_100_path"].removeprefix(f"s3://{s3_bucket}/run/")
    assert remote.read_bytes(key) == local.read_bytes(key)
