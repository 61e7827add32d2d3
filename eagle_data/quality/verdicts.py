"""Per-row verdicts over the validated frame: "pass", or the first reason a row is unfit for training.

Reasons are tried in a fixed order (request outcome, then token structure, then truncation, then
content), so each row carries exactly one reason and every dataset-level check counts a row under
one cause only: an empty "OK." reply is `short_loss`, not also `missing_reasoning`.

A special-token string inside the text (a prompt asking what `<|im_end|>` means) is set aside but is
no structural failure when the ids came out right: the token export is correct, but a trainer that
re-tokenizes the conversations export would turn the string into a control token.

`ids_match` False (the engine's own ids differ from re-tokenizing its text) is no reason: the
targets room then keeps the model's own ids, which is right for a draft model; it is counted instead.

A row whose prompt or reply overlaps a benchmark item (`contamination`, set by the validation stage,
see eagle_data/drafter/decontam.py) is `contaminated`: set aside, so no benchmark reaches a drafter.

Truncated rows are kept for training but flagged with the verdict "truncated": their tokens are still
the target model's own output, which is what a draft model learns from, and dropping them would bias
the data towards short replies (one real run had 18% of replies at the 4,096-token limit). They stay
out of training only when their token structure is broken, which is checked first.
"""

from __future__ import annotations

import polars as pl

from eagle_data.catalog import Checks

PASS = "pass"
TRUNCATED = "truncated"
CONTAMINATED = "contaminated"
CONTAMINATION = "contamination"  # the benchmark a row overlaps (eagle_data.drafter.decontam), else null
KEPT = frozenset({PASS, TRUNCATED})  # verdicts whose rows go to training
# Rejections the engine caused (an answer with no usable text, too little to train on, no reasoning where
# thinking was asked, text lost against the tokens it reported): another request may do better, so the
# generation asset's `retry_rejected` re-requests them. Structure and prompt faults are not among them.
ENGINE_SIDE_REJECTIONS = frozenset({"empty_completion", "short_loss", "missing_reasoning", "lost_text"})
STRUCTURE_REASONS = (
    "render_error",
    "bad_structure",
    "roundtrip_mismatch",
    "prefix_mismatch",
    "missing_eot",
)
REQUIRED_COLUMNS = (
    "prompt_id",
    "status",
    "finish_reason",
    "content",
    "reasoning",
    "completion_tokens",
    "loss_tokens",
    "roundtrip_ok",
    "prefix_ok",
    "structure_ok",
    "special_in_text",
    "eot_ok",
    "ids_match",
    "target_error",
)


CHECK_COLUMNS = (*REQUIRED_COLUMNS, "verdict")  # all the checks read: not the token lists, not messages


def require_columns(frame: pl.DataFrame) -> None:
    """Fail with one line naming the missing columns, instead of a polars error deep inside a check."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"validated frame lacks column(s) {', '.join(missing)}; expected {REQUIRED_COLUMNS}")


def is_truncated() -> pl.Expr:
    """A reply cut at max_tokens: by status, or by finish_reason when an engine only reports that."""
    return (pl.col("status") == "truncated") | (pl.col("finish_reason") == "length")


def is_answered() -> pl.Expr:
    """The engine returned a reply (complete or cut), i.e. not failed and not skipped for budget."""
    return pl.col("status").is_in(["ok", "truncated"])


def _false(column: str) -> pl.Expr:
    """A flag that is explicitly False; null (not checked, e.g. no engine ids) is not a failure."""
    return pl.col(column).eq(False).fill_null(False)


def _blank(column: str) -> pl.Expr:
    return pl.col(column).fill_null("").str.strip_chars() == ""


def _rules(checks: Checks, thinking: bool) -> list[tuple[str, pl.Expr]]:
    """(reason, condition) in the order they are tried; the first that holds is the verdict."""
    return [
        ("failed", pl.col("status") == "failed"),
        ("skipped_budget", pl.col("status") == "skipped_budget"),
        ("render_error", pl.col("target_error").fill_null("") != ""),  # the chat template refused the row
        ("bad_structure", _false("structure_ok")),
        ("roundtrip_mismatch", _false("roundtrip_ok")),
        ("prefix_mismatch", _false("prefix_ok")),
        ("special_token_in_text", pl.col("special_in_text").fill_null(0) > 0),
        (CONTAMINATED, pl.col(CONTAMINATION).is_not_null()),  # a benchmark's item in a prompt or reply
        (TRUNCATED, is_truncated()),
        ("missing_eot", _false("eot_ok")),
        ("empty_completion", _blank("content")),
        ("short_loss", pl.col("loss_tokens").fill_null(0) <= checks.min_loss_tokens),
        ("missing_reasoning", _blank("reasoning") & pl.lit(thinking)),
    ]


def row_verdicts(frame: pl.DataFrame, checks: Checks, thinking: bool) -> pl.DataFrame:
    """`frame` with a `verdict` column: "pass" or the first reason from `_rules`."""
    require_columns(frame)
    if CONTAMINATION not in frame.columns:  # a frame from before decontamination: nothing found
        frame = frame.with_columns(pl.lit(None, pl.String).alias(CONTAMINATION))
    verdict: pl.Expr = pl.lit(PASS)
    for reason, condition in reversed(_rules(checks, thinking)):
        verdict = pl.when(condition).then(pl.lit(reason)).otherwise(verdict)
    return frame.with_columns(verdict.alias("verdict"))


def split_rows(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(training rows, rejected rows); rejected rows keep their verdict so they can be looked at later."""
    if "verdict" not in frame.columns:
        raise ValueError("split_rows needs a `verdict` column: call row_verdicts first")
    kept = pl.col("verdict").is_in(list(KEPT))
    return frame.filter(kept), frame.filter(~kept)
