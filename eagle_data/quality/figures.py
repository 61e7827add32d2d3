"""Report figures: numbers Dagster plots across materializations, markdown tables, histogram bins.

Everything is a plain Python value; the Dagster layer wraps tables in MetadataValue.md and passes
numbers as they are. The HTML report (eagle_data/report.py) draws the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import polars as pl

from eagle_data.catalog import Checks
from eagle_data.quality import on_policy, sampled
from eagle_data.quality.summary import Summary, share, summarize
from eagle_data.quality.verdicts import is_answered

# Doubling bins: a spike of identical short replies (loss-mask sum 6) stands out next to replies of
# thousands of tokens. The last bin is open-ended.
EDGES = (0, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Token accounting, in percent of the engine's reported tokens: healthy rows sit at 95-104%; a server
# that strips special tokens or a reasoning field not read shows up in the low bins.
RATIO_EDGES = (0, 25, 50, 75, 90, 95, 100, 105, 125)

Bins = list[tuple[str, int]]


@dataclass(frozen=True)
class Figures:
    numbers: dict[str, float | int]  # numeric metadata, plotted by the Dagster UI over time
    tables: dict[str, str]  # markdown tables
    completion_hist: Bins
    loss_hist: Bins
    shards: list[dict[str, float | int | str]]  # one row per shard, in shard order
    verdicts: dict[str, int]  # verdict -> rows
    ratio_hist: Bins  # rebuilt tokens as % of the engine's reported tokens (RATIO_EDGES)


def histogram(values: pl.Series, edges: tuple[int, ...] = EDGES) -> Bins:
    """(label, count) per bin [edge, next edge); values below the first edge count in the first bin."""
    index = (pl.Series(edges).search_sorted(values.drop_nulls(), side="right") - 1).clip(0, len(edges) - 1)
    counts = index.value_counts()
    found = dict(zip(counts[counts.columns[0]].to_list(), counts["count"].to_list(), strict=True))
    labels = [f"{lo}–{hi - 1}" for lo, hi in pairwise(edges)] + [f"{edges[-1]}+"]
    return [(label, found.get(i, 0)) for i, label in enumerate(labels)]


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def count_numbers(s: Summary) -> dict[str, float | int]:
    """The figures that follow from a Summary's counts alone (so they also add up across shards)."""
    out: dict[str, float | int] = {
        "rows": s.rows,
        "train_rows": s.train_rows,
        "rejected_rows": s.rows - s.train_rows,
        "pass_share": share(s.verdicts.get("pass", 0), s.rows),
        "truncated_share": share(s.truncated, s.answered),
        "failed_share": share(s.failed, s.requested),
        "short_share": share(s.short, s.answered),
        "top_loss_share": share(s.top_loss_rows, s.completed),
        "repeat_share": share(s.top_repeat_prompts, s.prompts),
        "missing_reasoning_share": share(s.missing_reasoning, s.completed),
        "ids_mismatch_share": share(s.ids_mismatch, s.ids_checked),
        "lost_text_share": share(s.lost_text, s.answered),
        "loop_share": share(s.loops, s.answered),
    }
    if s.accounted:
        out["token_ratio"] = share(s.reply_tokens, s.engine_tokens)
    if s.avg_completion_tokens is not None:
        out["avg_completion_tokens"] = s.avg_completion_tokens
    return out


def _token_numbers(answered: pl.DataFrame) -> dict[str, float | int]:
    if not answered.height:
        return {"loss_tokens_total": 0}
    tokens = answered["completion_tokens"]
    return {
        "loss_tokens_total": int(answered["loss_tokens"].sum()),
        "p50_completion_tokens": float(tokens.quantile(0.5)),  # type: ignore[arg-type]
        "p90_completion_tokens": float(tokens.quantile(0.9)),  # type: ignore[arg-type]
        "max_completion_tokens": int(tokens.max()),  # type: ignore[arg-type]
        "avg_loss_tokens": float(answered["loss_tokens"].mean()),  # type: ignore[arg-type]
    }


def shard_row(key: str, s: Summary) -> dict[str, float | int | str]:
    """One line of the per-shard trend table."""
    return {
        "shard": key,
        "rows": s.rows,
        "train_rows": s.train_rows,
        "truncated_share": round(share(s.truncated, s.answered), 4),
        "failed_share": round(share(s.failed, s.requested), 4),
        "short_share": round(share(s.short, s.answered), 4),
        "avg_completion_tokens": round(s.avg_completion_tokens or 0.0, 1),
    }


def tables(
    completion_hist: Bins,
    loss_hist: Bins,
    ratio_hist: Bins,
    verdicts: dict[str, int],
    shards: list[dict[str, float | int | str]],
    top_loss: list[tuple[int, int]],
    replies: int,
) -> dict[str, str]:
    """The markdown tables of the report; `top_loss` is (loss-mask sum, rows), most common first."""
    out = {
        "completion_tokens_histogram": markdown_table(["completion tokens", "rows"], list(map(list, completion_hist))),
        "loss_tokens_histogram": markdown_table(["loss-mask sum", "rows"], list(map(list, loss_hist))),
        "token_ratio_histogram": markdown_table(["rebuilt tokens, % of reported", "rows"], list(map(list, ratio_hist))),
        "top_loss_sums": markdown_table(
            ["loss-mask sum", "rows", "share of replies"], [[v, n, f"{share(n, replies):.1%}"] for v, n in top_loss]
        ),
        "verdicts": markdown_table(["verdict", "rows"], [[v, n] for v, n in sorted(verdicts.items())]),
    }
    if shards:
        out["shards"] = markdown_table(list(shards[0]), [list(r.values()) for r in shards])
    return out


def ratio_histogram(frame: pl.DataFrame) -> Bins:
    """The accounting ratio of every row that has one, in RATIO_EDGES bins."""
    return histogram((frame["token_ratio"].drop_nulls() * 100).floor().cast(pl.Int64), RATIO_EDGES)


def figures(frame: pl.DataFrame, checks: Checks, summary: Summary | None = None) -> Figures:
    """All report figures of a verdicted frame; pass the frame's `summary` when it is already at hand, so
    the frame is summarized once. Per-shard trends come from the roll-up of shard records (rollup.py)."""
    s = summary or summarize(frame, checks)
    answered = frame.filter(is_answered())
    completion_hist = histogram(answered["completion_tokens"])
    loss_hist = histogram(answered["loss_tokens"])
    ratio_hist = ratio_histogram(frame)
    top_loss = answered.group_by("loss_tokens").len().sort(["len", "loss_tokens"], descending=[True, False])
    top = list(top_loss.head(5).iter_rows())
    md = tables(completion_hist, loss_hist, ratio_hist, s.verdicts, [], top, answered.height)
    numbers = count_numbers(s) | _token_numbers(answered) | on_policy_numbers(frame) | sampled.numbers(frame)
    return Figures(numbers, md, completion_hist, loss_hist, [], s.verdicts, ratio_hist)


# The on-policy score's metadata (eagle_data/quality/on_policy.py): sums that add up across shards, and scored
# rows per band of top-1 agreement (the report's histogram).
ON_POLICY_EDGES = (0.5, 0.8, 0.9, 0.95, 0.99)


def _on_policy_bands() -> list[str]:
    bounds = [0.0, *ON_POLICY_EDGES, 1.0]
    return [f"{lo:g}-{hi:g}" for lo, hi in pairwise(bounds)]


def on_policy_numbers(frame: pl.DataFrame) -> dict[str, float | int]:
    """A validated frame's on-policy metadata ({} when no row was scored): the totals, and rows per band of
    top-1 agreement (`on_policy_rows_agreement_<band>`, the report's histogram)."""
    t = on_policy.frame_totals(frame)
    if not t.rows:
        return {}
    shares = [r["hits"] / r["tokens"] for r in frame[on_policy.COLUMN].to_list() if r and r["tokens"]]
    index = np.searchsorted(np.asarray(ON_POLICY_EDGES), np.asarray(shares, dtype=float), side="right")
    counts = np.bincount(index, minlength=len(ON_POLICY_EDGES) + 1)
    bins = {
        f"{on_policy.PREFIX}rows_agreement_{label}": int(n) for label, n in zip(_on_policy_bands(), counts, strict=True)
    }
    return t.numbers() | bins


def on_policy_rolled(many: Sequence[Mapping[str, float | int]]) -> dict[str, float | int]:
    """Shards' on-policy metadata added up into the dataset's ({} when no shard was scored)."""
    keys = [f"{on_policy.PREFIX}rows", *(f"{on_policy.PREFIX}rows_agreement_{label}" for label in _on_policy_bands())]
    keys += [on_policy.sum_figure(name) for name in on_policy.RAW]
    summed = {key: sum(float(n.get(key, 0)) for n in many) for key in keys}
    if not summed[f"{on_policy.PREFIX}rows"]:
        return {}
    t = on_policy.Totals(
        int(summed[f"{on_policy.PREFIX}rows"]), {n: summed[on_policy.sum_figure(n)] for n in on_policy.RAW}
    )
    return {key: int(v) for key, v in summed.items() if "_rows" in key} | t.numbers()


def on_policy_bins(numbers_: Mapping[str, float | int]) -> list[tuple[str, int]]:
    """The histogram of rows by top-1 agreement, read back from metadata ([] when nothing was scored)."""
    found = [
        (label, int(numbers_.get(f"{on_policy.PREFIX}rows_agreement_{label}", -1))) for label in _on_policy_bands()
    ]
    return found if all(n >= 0 for _, n in found) else []
