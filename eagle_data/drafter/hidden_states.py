"""The hidden-state plan: disk bytes and GPU-hours of capturing the target's hidden states for the mix.

Offline EAGLE-3 training stores, for every token of every sample, `captured_layers` hidden-state vectors
of `hidden_size` values, plus the sample's input ids and loss mask (SpecForge: int64 tensors, 16 bytes a
token; each format's figure and its per-file framing are in `formats.ID_BYTES` / `SAMPLE_BYTES`).
bf16 takes 2 bytes a value, fp32 4; fp8 1 byte a value plus a float32 scale per token and layer (the
native format). The `hidden_states` asset's `bytes_match_plan` check holds this formula to the files it
wrote, within 2%. An 8,192-token sample of an 8B target (4 layers of 4,096) is 268 MB in bf16: teams
that size the disk after starting find out when it fills. GPU time is the target's forward pass over
every token, 2 FLOPs per parameter a token, at the recipe's achieved share (mfu) of the GPU's dense
bf16 rate: a planning figure to replace with a measured throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from eagle_data.drafter.formats import ID_BYTES, SAMPLE_BYTES
from eagle_data.drafter.settings import HiddenStateRecipe

VALUE_BYTES = {"bf16": 2, "fp32": 4, "fp8": 1}
SCALE_BYTES = {"bf16": 0, "fp32": 0, "fp8": 4}  # fp8: one float32 scale per token and captured layer


def bytes_per_token(recipe: HiddenStateRecipe) -> int:
    per_layer = recipe.hidden_size * VALUE_BYTES[recipe.dtype] + SCALE_BYTES[recipe.dtype]
    return recipe.captured_layers * per_layer + ID_BYTES[recipe.format]


def capture_bytes(recipe: HiddenStateRecipe, samples: int, tokens: int) -> int:
    """Bytes on disk of `samples` samples holding `tokens` tokens in the recipe's format."""
    return tokens * bytes_per_token(recipe) + samples * SAMPLE_BYTES[recipe.format]


@dataclass(frozen=True)
class Plan:
    """The capture's size for one recipe, from the token counts of the samples to capture."""

    samples: int
    tokens: int
    longest_sample_tokens: int
    bytes_per_token: int
    total_bytes: int
    longest_sample_bytes: int
    gpu_hours: float
    per_dataset_bytes: dict[str, int]

    def figures(self) -> dict[str, int | float]:
        return {
            "hs_samples": self.samples,
            "hs_tokens": self.tokens,
            "hs_bytes_per_token": self.bytes_per_token,
            "hs_total_bytes": self.total_bytes,
            "hs_total_gb": round(self.total_bytes / 1e9, 3),
            "hs_longest_sample_bytes": self.longest_sample_bytes,
            "hs_gpu_hours": round(self.gpu_hours, 3),
        }

    def markdown(self, recipe: HiddenStateRecipe) -> str:
        rows = "\n".join(f"| {name} | {n / 1e9:,.3f} |" for name, n in sorted(self.per_dataset_bytes.items()))
        return (
            f"Recipe: {recipe.captured_layers} layers x {recipe.hidden_size} values, {recipe.dtype}, {recipe.format} "
            "format; "
            f"{recipe.target_params_b:g}B target at {recipe.mfu:.0%} of {recipe.gpu_tflops:g} TFLOP/s.\n\n"
            f"| figure | value |\n| --- | --- |\n| samples | {self.samples:,} |\n| tokens | {self.tokens:,} |\n"
            f"| bytes per token | {self.bytes_per_token:,} |\n| disk | {self.total_bytes / 1e9:,.3f} GB |\n"
            f"| longest sample | {self.longest_sample_tokens:,} tokens, {self.longest_sample_bytes / 1e6:,.1f} MB |\n"
            f"| GPU-hours | {self.gpu_hours:,.2f} |\n\n| dataset | GB |\n| --- | --- |\n{rows}\n"
        )


def plan(per_dataset: pl.DataFrame, recipe: HiddenStateRecipe) -> Plan:
    """`per_dataset`: columns `dataset`, `samples`, `tokens` (summed) and `longest` (one sample's most)."""
    tokens = int(per_dataset["tokens"].sum())
    samples = int(per_dataset["samples"].sum())
    longest = int(per_dataset["longest"].max() or 0)
    flops = 2 * recipe.target_params_b * 1e9 * tokens
    return Plan(
        samples=samples,
        tokens=tokens,
        longest_sample_tokens=longest,
        bytes_per_token=bytes_per_token(recipe),
        total_bytes=capture_bytes(recipe, samples, tokens),
        longest_sample_bytes=capture_bytes(recipe, 1, longest),
        gpu_hours=flops / (recipe.gpu_tflops * 1e12 * recipe.mfu) / 3600,
        per_dataset_bytes={
            name: capture_bytes(recipe, int(n), int(t))
            for name, n, t in per_dataset.select("dataset", "samples", "tokens").iter_rows()
        },
    )


def mix_token_counts(path: Path) -> pl.DataFrame:
    """Samples, tokens and the longest sample per dataset of a mix file, counted streaming."""
    length = pl.col("input_ids").list.len().cast(pl.Int64)
    return (
        pl.scan_parquet(path)
        .group_by("dataset")
        .agg(pl.len().cast(pl.Int64).alias("samples"), length.sum().alias("tokens"), length.max().alias("longest"))
        .collect(engine="streaming")
    )
