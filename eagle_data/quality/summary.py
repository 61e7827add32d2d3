"""The counts every check and report figure is computed from, taken in one pass over a verdicted frame.

Works on whatever frame it is handed (one shard or several), which is what makes the checks
partition-aware: a partitioned asset check summarizes its shard, a dataset report all shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import polars as pl

from eagle_data.catalog import Checks
from eagle_data.quality.verdicts import (
    EMPTY_REPLY,
    KEPT,
    LOOP,
    LOST_TEXT,
    PASS,
    SHORT_REASONS,
    STRUCTURE_REASONS,
    TRUNCATED,
    error_kind,
    is_answered,
    is_truncated,
    reported_tokens,
)


def share(part: int, whole: int) -> float:
    """part / whole, 0.0 for an empty whole (an empty shard has no regression to report)."""
    return part / whole if whole else 0.0


def lower_bound(hits: int, n: int, confidence: float) -> float:
    """One-sided Wilson score lower bound of the share hits/n at `confidence`: the one bound every share gate
    is judged on (the shard gates and the canary at the catalog's `checks.confidence`, the breaker's window at
    `breaker.confidence`), so a share over its gate fails only when the rows make it sure. 0 for no rows."""
    if n == 0:
        return 0.0
    z = NormalDist().inv_cdf(confidence)
    p = hits / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


@dataclass(frozen=True)
class Summary:
    """Row counts of one frame. "completed" = answered and not truncated: the rows whose length says
    something about the model (a truncated reply's length only says what max_tokens was). Fields added
    later carry defaults, so records written before them still read."""

    rows: int
    requested: int  # rows minus skipped_budget: a request was made
    failed: int
    answered: int  # ok or truncated
    truncated: int  # answered rows cut at max_tokens and kept (verdict truncated): a cut loop counts as a loop
    completed: int  # answered rows not cut at max_tokens
    short: int  # answered rows set aside as empty_completion or short_loss (loss-mask sum <= min_loss_tokens)
    top_loss_value: int | None  # the most common loss-mask sum among completed rows not set aside
    top_loss_rows: int
    prompts: int  # distinct prompt ids among completed rows
    top_repeat_text: str  # the completion text answering the most distinct prompts (two or more), rows not set aside
    top_repeat_prompts: int  # 0 when no text answers two prompts
    missing_reasoning: int  # rows with the verdict missing_reasoning
    structure: dict[str, int]  # structural verdict -> rows (only reasons that occur)
    first_bad_prompt: str  # prompt_id of one structurally broken row, "" when none
    avg_completion_tokens: float | None  # over answered rows
    ids_checked: int  # rows where the engine returned its own ids
    ids_mismatch: int  # ... that differ from re-tokenizing the text (the model's ids are kept)
    verdicts: dict[str, int]
    train_rows: int
    lost_text: int = 0  # rows with the verdict lost_text
    accounted: int = 0  # answered rows whose reported tokens could be weighed against the rebuilt ones
    engine_tokens: int = 0  # over accounted rows: what the engine reported ...
    reply_tokens: int = 0  # ... and what the rebuilt turns hold
    loops: int = 0  # rows with the verdict loop
    empty_failed: int = 0  # failed rows whose last reply was billed and empty (error `empty_reply`)
    lost_failed: int = 0  # failed rows whose last reply was billed and lost its text (error `lost_text`)


def summarize(frame: pl.DataFrame, checks: Checks) -> Summary:
    """Counts of a frame that already has a `verdict` column (see row_verdicts). Each row counts under its one
    verdict: a row set aside for one reason is not counted again by another gate (the dominance figures, the
    short and truncated counts read the verdict, not the raw lengths)."""
    flagged = frame.with_columns(_answered=is_answered(), _cut=is_truncated() & is_answered()).with_columns(
        _completed=pl.col("_answered") & ~pl.col("_cut")
    )
    completed = flagged.filter("_completed")
    kept = completed.filter(pl.col("verdict") == PASS)
    top_loss = kept.group_by("loss_tokens").len().sort(["len", "loss_tokens"], descending=[True, False])
    repeats = (
        kept.group_by("content")
        .agg(pl.col("prompt_id").n_unique().alias("prompts"))
        .filter(pl.col("prompts") > 1)
        .sort(["prompts", "content"], descending=[True, False])
    )
    verdicts = dict(frame.group_by("verdict").len().sort("verdict").iter_rows())
    structure = {reason: verdicts[reason] for reason in STRUCTURE_REASONS if reason in verdicts}
    bad = frame.filter(pl.col("verdict").is_in(list(STRUCTURE_REASONS)))
    answered = flagged.filter("_answered")
    accounted = frame.filter(pl.col("token_ratio").is_not_null())
    failed_kinds = frame.filter(pl.col("status") == "failed").select(error_kind())["error_kind"].value_counts()
    kinds = dict(failed_kinds.iter_rows())
    return Summary(
        rows=frame.height,
        requested=frame.height - verdicts.get("skipped_budget", 0),
        failed=int((frame["status"] == "failed").sum()),
        answered=answered.height,
        truncated=verdicts.get(TRUNCATED, 0),
        completed=completed.height,
        short=sum(verdicts.get(reason, 0) for reason in SHORT_REASONS),
        top_loss_value=top_loss["loss_tokens"][0] if top_loss.height else None,
        top_loss_rows=top_loss["len"][0] if top_loss.height else 0,
        prompts=completed["prompt_id"].n_unique(),
        top_repeat_text=(repeats["content"][0] or "") if repeats.height else "",
        top_repeat_prompts=repeats["prompts"][0] if repeats.height else 0,
        missing_reasoning=verdicts.get("missing_reasoning", 0),
        structure=structure,
        first_bad_prompt=bad["prompt_id"][0] if bad.height else "",
        avg_completion_tokens=float(answered["completion_tokens"].mean()) if answered.height else None,  # type: ignore[arg-type]
        verdicts=verdicts,
        ids_checked=int(frame["ids_match"].is_not_null().sum()),
        ids_mismatch=int(frame["ids_match"].eq(False).sum()),
        train_rows=sum(n for v, n in verdicts.items() if v in KEPT),
        lost_text=verdicts.get(LOST_TEXT, 0),
        accounted=accounted.height,
        engine_tokens=int(accounted.select(reported_tokens().sum()).item()) if accounted.height else 0,
        reply_tokens=int(accounted["reply_tokens"].sum()) if accounted.height else 0,
        loops=verdicts.get(LOOP, 0),
        empty_failed=kinds.get(EMPTY_REPLY, 0),
        lost_failed=kinds.get(LOST_TEXT, 0),
    )
