"""The counts every check and report figure is computed from, taken in one pass over a verdicted frame.

Works on whatever frame it is handed (one shard or several), which is what makes the checks
partition-aware: a partitioned asset check summarizes its shard, a dataset report all shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from eagle_data.catalog import Checks
from eagle_data.quality.verdicts import KEPT, LOST_TEXT, STRUCTURE_REASONS, is_answered, is_truncated, reported_tokens


def share(part: int, whole: int) -> float:
    """part / whole, 0.0 for an empty whole (an empty shard has no regression to report)."""
    return part / whole if whole else 0.0


def wilson_lower(hits: int, n: int, z: float) -> float:
    """One-sided Wilson score lower bound of the share hits/n at normal quantile z."""
    if n == 0:
        return 0.0
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
    truncated: int
    completed: int
    short: int  # answered rows (complete or cut) with loss-mask sum <= min_loss_tokens
    top_loss_value: int | None  # the most common loss-mask sum among completed rows
    top_loss_rows: int
    prompts: int  # distinct prompt ids among completed rows
    top_repeat_text: str  # the completion text answering the most distinct prompts (two or more)
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


def summarize(frame: pl.DataFrame, checks: Checks) -> Summary:
    """Counts of a frame that already has a `verdict` column (see row_verdicts)."""
    flagged = frame.with_columns(_answered=is_answered(), _truncated=is_truncated() & is_answered()).with_columns(
        _completed=pl.col("_answered") & ~pl.col("_truncated")
    )
    completed = flagged.filter("_completed")
    top_loss = completed.group_by("loss_tokens").len().sort(["len", "loss_tokens"], descending=[True, False])
    repeats = (
        completed.group_by("content")
        .agg(pl.col("prompt_id").n_unique().alias("prompts"))
        .filter(pl.col("prompts") > 1)
        .sort(["prompts", "content"], descending=[True, False])
    )
    verdicts = dict(frame.group_by("verdict").len().sort("verdict").iter_rows())
    structure = {reason: verdicts[reason] for reason in STRUCTURE_REASONS if reason in verdicts}
    bad = frame.filter(pl.col("verdict").is_in(list(STRUCTURE_REASONS)))
    answered = flagged.filter("_answered")
    accounted = frame.filter(pl.col("token_ratio").is_not_null())
    return Summary(
        rows=frame.height,
        requested=frame.height - verdicts.get("skipped_budget", 0),
        failed=int((frame["status"] == "failed").sum()),
        answered=answered.height,
        truncated=int(flagged["_truncated"].sum()),
        completed=completed.height,
        short=int((answered["loss_tokens"].fill_null(0) <= checks.min_loss_tokens).sum()),
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
    )
