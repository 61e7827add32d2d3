"""The EAGLE-3 draft vocabulary: which target tokens a small-vocabulary drafter can propose.

Counted over the supervised tokens of the training mix (ids whose loss mask is 1), streaming: polars'
streaming engine explodes and groups the mix batch by batch, so memory holds one batch and one count
per distinct id, never the mix.

The mapping follows SpecForge's convention (`process_token_dict_to_mappings`), which EAGLE-3 trainers
load: the top-N ids by count, padded with the lowest ids that never occur (count 0) when fewer than N
occur, sorted ascending as `used`; `d2t[i] = used[i] - i` (an offset: target id = i + d2t[i]), int64;
`t2d` a bool mask over the target model's whole vocabulary, True where the id is in `used`; saved as
`torch.save({"d2t": d2t, "t2d": t2d})`. Ties in count are broken by id, lower first (SpecForge leaves
them in Counter insertion order, i.e. data order), so the same mix always gives the same mapping.

The same mapping is written in the format each chosen trainer loads (`trainers.VOCAB_FILES`,
`mapping_files`): speculators' `d2t-{N}.npy` / `t2d-{N}.npy` (`np.save`, its `--d2t-path` / `--t2d-path`;
speculators' own `build_vocab_mappings_from_distribution` picks the same ids), ModelOpt's `d2t-{N}.pt`
(`torch.save` of the d2t tensor). The counts are also written in speculators' token-frequency format
(`torch.save` of a dict {token id: count} over ids that occur), which its `build_vocab_mapping` script reads.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from eagle_data.types import UserError


class VocabError(UserError, ValueError):
    """The mix and the target disagree; the message says what to fix."""


def count_supervised(path: Path, vocab_size: int) -> np.ndarray:
    """Occurrences of each target id among the supervised tokens of a mix file (int64, length vocab_size)."""
    per_id = (
        pl.scan_parquet(path)
        .select("input_ids", "loss_mask")
        .explode("input_ids", "loss_mask")
        .filter(pl.col("loss_mask") == 1)
        .group_by("input_ids")
        .agg(pl.col("loss_mask").cast(pl.Int64).sum().alias("count"))
        .collect(engine="streaming")
    )
    ids = per_id["input_ids"].to_numpy()
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids.max() if ids.max() >= vocab_size else ids.min())
        raise VocabError(
            f"the mix holds token id {bad}, outside the target vocabulary of {vocab_size}: "
            "it was tokenized for another target; re-export it or fix the catalog's target"
        )
    counts = np.zeros(vocab_size, dtype=np.int64)
    counts[ids] = per_id["count"].to_numpy()
    return counts


def select_draft_ids(counts: np.ndarray, size: int) -> np.ndarray:
    """The `used` ids of a draft vocabulary of `size`: top by count, ties and zero-count padding by lowest id."""
    if size > counts.size:
        raise VocabError(f"draft vocabulary size {size} exceeds the target vocabulary ({counts.size}); lower it")
    order = np.argsort(-counts, kind="stable")  # stable: equal counts stay in id order
    return np.sort(order[:size])


@dataclass(frozen=True)
class DraftVocab:
    """One mapping: `used` ids (ascending), the d2t offsets, the t2d mask, and the share of supervised
    tokens the drafter's vocabulary covers (what acceptance is bounded by)."""

    used: np.ndarray
    d2t: np.ndarray
    t2d: np.ndarray
    coverage: float


def draft_vocab(counts: np.ndarray, size: int) -> DraftVocab:
    used = select_draft_ids(counts, size)
    t2d = np.zeros(counts.size, dtype=bool)
    t2d[used] = True
    total = int(counts.sum())
    coverage = float(counts[used].sum()) / total if total else 0.0
    return DraftVocab(used, used.astype(np.int64) - np.arange(size, dtype=np.int64), t2d, coverage)


def _torch_bytes(obj: Any) -> bytes:
    import torch  # the `local` extra; only the drafter outputs need it

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def mapping_bytes(vocab: DraftVocab) -> bytes:
    """The file EAGLE-3 trainers load: {"d2t": int64 tensor, "t2d": bool tensor}."""
    import torch

    return _torch_bytes({"d2t": torch.from_numpy(vocab.d2t.copy()), "t2d": torch.from_numpy(vocab.t2d.copy())})


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def mapping_files(vocab: DraftVocab, names: list[str]) -> dict[str, bytes]:
    """The bytes of each named mapping file (`trainers.vocab_names`), by its name's pattern."""
    import torch

    def one(name: str) -> bytes:
        if name.startswith("vocab_mapping_"):
            return mapping_bytes(vocab)
        if name.endswith(".npy"):
            return _npy_bytes(vocab.d2t if name.startswith("d2t") else vocab.t2d)
        return _torch_bytes(torch.from_numpy(vocab.d2t.copy()))  # ModelOpt's d2t cache

    return {name: one(name) for name in names}


def token_freq_bytes(counts: np.ndarray) -> bytes:
    """speculators' token-frequency file: {token id: count} over the ids that occur."""
    ids = np.flatnonzero(counts)
    return _torch_bytes(dict(zip(ids.tolist(), counts[ids].tolist(), strict=True)))


def counts_from_token_freq(data: bytes, vocab_size: int) -> np.ndarray:
    """The counts back from a token-frequency file (the cache of a counted mix)."""
    import torch

    freq = torch.load(io.BytesIO(data), weights_only=True)
    counts = np.zeros(vocab_size, dtype=np.int64)
    if freq:
        counts[np.fromiter(freq.keys(), dtype=np.int64)] = np.fromiter(freq.values(), dtype=np.int64)
    return counts
