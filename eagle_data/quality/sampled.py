"""The sampled tokens' own log-probabilities, as the engine reported them with each reply (no extra request).

Where an engine returns, beside its reply, each sampled token's log-probability and the k most likely tokens at that
step (OpenAI's chat `logprobs` / `top_logprobs`; the embedded engine from the logits it samples from), a row keeps
three sums over its replies: the tokens that carry a value, the sum of their log-probabilities, and how many sat at
each rank among the listed tokens (rank 0: the server's own top choice). The top-1 share is the server's word on how
on-policy its replies are; the blocking `on_policy` check never takes it (it scores rows with the target itself,
eagle_data/quality/on_policy.py) and shows it beside its own figures as a cross-check.

A rank is the number of listed tokens more likely than the sampled one, capped at k - 1: vLLM lists the sampled
token itself first among the k (then the k - 1 most likely others), so there rank k - 1 and "not among the k most
likely" read alike, and the last bucket holds both. Pure: polars only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import polars as pl

from eagle_data.catalog import OnPolicy
from eagle_data.quality.on_policy import PREFIX as ON_POLICY_PREFIX
from eagle_data.types import SampledLogprobs

COLUMN = "sampled_logprobs"  # the generation and validated rows' struct (null where the engine reported none)
DTYPE = pl.Struct({"tokens": pl.Int32, "logprob": pl.Float64, "ranks": pl.List(pl.Int32)})
PREFIX = f"{ON_POLICY_PREFIX}sampled_"  # of every metadata figure
NO_VALUE = -9999.0  # vLLM writes this where a token has no value (or -inf): not a log-probability
RANK_EDGES = (0, 1, 2, 3, 5, 10)  # the rank bands of the metadata and the report's histogram (the last open-ended)
SUMS = ("rows", "tokens", "top1", "logprob_sum")


def asked_top_logprobs(settings: OnPolicy) -> int:
    """The most likely tokens generation asks for beside each sampled one (the catalog's `top_logprobs`); 0 when the
    catalog does not ask for the sampled tokens' log-probabilities."""
    return settings.top_logprobs if settings.sampled_logprobs else 0


def rank_of(logprob: float, listed: Iterable[float], k: int) -> int:
    """How many listed tokens the server found more likely than the sampled one, capped at k - 1."""
    return min(sum(1 for other in listed if other > logprob), k - 1)


def figures(logprobs: Sequence[float], ranks: Sequence[int], k: int) -> SampledLogprobs:
    """One reply's figures from its tokens' log-probabilities and ranks (each below k)."""
    counts = [0] * k
    for rank in ranks:
        counts[rank] += 1
    return {"tokens": len(logprobs), "logprob": float(sum(logprobs)), "ranks": counts}


def added(replies: Iterable[SampledLogprobs | None]) -> SampledLogprobs | None:
    """A row's figures: its replies' added up; None when one of them has none (a turn from before they were asked
    for would leave the row's sums short of its tokens)."""
    total: SampledLogprobs | None = None
    for reply in replies:
        if reply is None:
            return None
        if total is None:
            total = {"tokens": 0, "logprob": 0.0, "ranks": []}
        width = max(len(total["ranks"]), len(reply["ranks"]))
        ranks = [a + b for a, b in zip(_padded(total["ranks"], width), _padded(reply["ranks"], width), strict=True)]
        total = {"tokens": total["tokens"] + reply["tokens"], "logprob": total["logprob"] + reply["logprob"],
                 "ranks": ranks}  # fmt: skip
    return total


def _padded(counts: Sequence[int], width: int) -> list[int]:
    return [*counts, *[0] * (width - len(counts))]


def _bands() -> list[str]:
    spans = [f"{lo}" if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in pairwise(RANK_EDGES)]
    return [*spans, f"{RANK_EDGES[-1]}+"]


def numbers(frame: pl.DataFrame) -> dict[str, float | int]:
    """A frame's sums (which add up across shards, `on_policy_sampled_rows`, `_tokens`, `_top1`, `_logprob_sum`, and
    tokens per rank band, `_rank_<band>`), and the shares they give; {} when no row carries figures."""
    rows = [r for r in frame[COLUMN].to_list() if r] if COLUMN in frame.columns else []
    if not rows:
        return {}
    bands = [0] * len(RANK_EDGES)
    for row in rows:
        for rank, count in enumerate(row["ranks"] or []):
            bands[sum(rank >= edge for edge in RANK_EDGES[1:])] += count
    sums = {"rows": len(rows), "tokens": sum(r["tokens"] for r in rows), "top1": bands[0],
            "logprob_sum": sum(r["logprob"] for r in rows)}  # fmt: skip
    out = {f"{PREFIX}{name}": value for name, value in sums.items()}
    return _shares(out) | {f"{PREFIX}rank_{label}": n for label, n in zip(_bands(), bands, strict=True)}


def _shares(sums: Mapping[str, float | int]) -> dict[str, float | int]:
    """The sums rounded as metadata, with the top-1 share and mean log-probability per token they give."""
    out: dict[str, float | int] = {k: round(v, 4) if isinstance(v, float) else int(v) for k, v in sums.items()}
    if tokens := sums[f"{PREFIX}tokens"]:
        out[f"{PREFIX}agreement"] = round(sums[f"{PREFIX}top1"] / tokens, 4)
        out[f"{PREFIX}mean_logprob"] = round(sums[f"{PREFIX}logprob_sum"] / tokens, 4)
    return out


def rolled(many: Sequence[Mapping[str, Any]]) -> dict[str, float | int]:
    """Shards' figures added up into the dataset's ({} when no shard had any)."""
    keys = [*(f"{PREFIX}{name}" for name in SUMS), *(f"{PREFIX}rank_{label}" for label in _bands())]
    summed = {key: sum(float(n.get(key, 0)) for n in many) for key in keys}
    if not summed[f"{PREFIX}rows"]:
        return {}
    ints = {key: int(value) for key, value in summed.items() if key != f"{PREFIX}logprob_sum"}
    return _shares({**summed, **ints})


def rank_bins(figures_: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The histogram of sampled tokens by rank band, read back from metadata ([] when there is none)."""
    found = [(label, int(figures_.get(f"{PREFIX}rank_{label}", -1))) for label in _bands()]
    return found if all(n >= 0 for _, n in found) else []


def cross_check(figures_: Mapping[str, Any]) -> str:
    """One clause on what the engine itself reported ("" when it reported nothing), beside the target's own score."""
    if not figures_.get(f"{PREFIX}tokens"):
        return ""
    return (
        f"the engine's own log-probabilities of its sampled tokens (not judged): top-1 share "
        f"{figures_[f'{PREFIX}agreement']:.3f} over {int(figures_[f'{PREFIX}tokens']):,} tokens of "
        f"{int(figures_[f'{PREFIX}rows'])} rows, mean log-probability {figures_[f'{PREFIX}mean_logprob']:.3f}"
    )
