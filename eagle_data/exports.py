"""What leaves the pipeline for draft-model trainers, built from `{ds}_validated` frames (pure).

- SpecForge-style conversations JSONL: {"id", "conversations": [{role, content, reasoning?}]}.
- Tokenized parquet for DFlash / EAGLE-3 offline training: prompt_id, dataset, input_ids, loss_mask.
- A training mix across datasets with per-dataset weights, reproducible from a seed.
Only rows the quality verdicts keep for training are exported (quality.KEPT).
"""

from __future__ import annotations

import json
import random

import polars as pl

from eagle_data import provenance
from eagle_data.quality import split_rows

TRAINING_COLUMNS = ("prompt_id", "dataset", "input_ids", "loss_mask")


def passed(validated: pl.DataFrame) -> pl.DataFrame:
    """The rows the quality verdicts keep for training ("pass", and "truncated": the model's own tokens)."""
    return split_rows(validated)[0]


def to_specforge_jsonl(validated: pl.DataFrame) -> bytes:
    """One JSON line per passing row; reasoning stays in its own field, never folded into content."""
    rows = passed(validated).select("prompt_id", "messages")
    lines = []
    for prompt_id, messages in rows.iter_rows():
        turns = [
            {"role": m["role"], "content": m["content"]}
            | ({"reasoning": m["reasoning"] or ""} if m["role"] == "assistant" else {})
            for m in messages
        ]
        lines.append(json.dumps({"id": prompt_id, "conversations": turns}, ensure_ascii=False) + "\n")
    return "".join(lines).encode()


def to_training_parquet(validated: pl.DataFrame) -> pl.DataFrame:
    """Token ids and loss masks of the passing rows, with how each was made (eagle_data.provenance; null
    where a shard predates a column), ready to write as parquet."""
    kept = passed(validated).with_columns(
        pl.col("input_ids").cast(pl.List(pl.Int32)), pl.col("loss_mask").cast(pl.List(pl.UInt8))
    )
    made_by = [pl.col(c) if c in kept.columns else pl.lit(None, pl.String).alias(c) for c in provenance.COLUMNS]
    return kept.select(*TRAINING_COLUMNS, *made_by)


def mix(frames: dict[str, pl.DataFrame], weights: dict[str, float], seed: int) -> pl.DataFrame:
    """Datasets combined with a per-dataset weight, shuffled; the same inputs and seed give the same rows.

    A weight multiplies the dataset's rows: 1 keeps each row once, 0.5 a random half, 2.5 every row
    twice plus a random half, 0 none. Every dataset in `frames` needs a weight.
    """
    if not frames:
        raise ValueError("mix: no datasets given")
    missing = sorted(set(frames) - set(weights))
    if missing:
        raise ValueError(f"mix: no weight for {', '.join(missing)}; give every dataset a weight (0 leaves it out)")
    parts = []
    for name in sorted(frames):
        frame, weight = frames[name], weights[name]
        if weight < 0:
            raise ValueError(f"mix: weight for {name} is {weight}; weights must be >= 0")
        whole, fraction = divmod(weight, 1.0)
        rng = random.Random(f"{seed}:{name}")  # per dataset: adding a dataset moves no other's rows
        extra = sorted(rng.sample(range(frame.height), round(fraction * frame.height)))
        part = frame.select(pl.all().gather([*range(frame.height)] * int(whole) + extra))
        parts.append(part if "dataset" in part.columns else part.with_columns(dataset=pl.lit(name)))
    out = pl.concat(parts, how="vertical")
    order = list(range(out.height))
    random.Random(seed).shuffle(order)
    return out.select(pl.all().gather(order))
