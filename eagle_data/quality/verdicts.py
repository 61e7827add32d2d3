"""Per-row verdicts over the validated frame: "pass", or the first reason a row is unfit for training.

Reasons are tried in a fixed order (request outcome, then token structure, then truncation, then
content), so each row carries exactly one reason and every dataset-level check counts a row under
one cause only: an empty "OK." reply is `short_loss`, not also `missing_reasoning`.

A special-token string inside the text (a prompt asking what `<|im_end|>` means) is set aside but is
no structural failure when the ids came out right: the token export is correct, but a trainer that
re-tokenizes the conversations export would turn the string into a control token.

`ids_match` False (the engine's own ids differ from re-tokenizing its text) is no reason: the
targets room then keeps the model's own ids, which is right for a draft model; it is counted instead.

`prompt_ok` False (the prompt ids the server reports it used differ from our rendering of that prompt:
another chat template, or control-token text in the user's message parsed as control tokens) is
`prompt_mismatch`, a structure failure: the reply was generated from a prompt our ids do not describe.
Every server reports how many prompt tokens it counted; where that differs from our rendering of the same
prompts (`rendered_prompt_tokens`) by more than one token a turn and `prompt_tokens_tolerance` of ours, the row is
`prompt_count_mismatch`, a structure failure too: another vocabulary or template (a missing default system turn)
made the reply. An id outside the target's vocabulary (`vocab_ok` False) is `wrong_vocabulary`.

A row whose prompt or reply overlaps a benchmark item (`contamination`, set by the validation stage,
see eagle_data/quality/decontam.py) is `contaminated`: set aside, so no benchmark reaches a drafter.

Truncated rows are kept for training but flagged with the verdict "truncated": their tokens are still
the target model's own output, which is what a draft model learns from, and dropping them would bias
the data towards short replies (one real run had 18% of replies at the 4,096-token limit). They stay
out of training when their token structure is broken, when their text was lost, or when they carry
nothing to learn (no reasoning and no content, or a loss-mask sum at or under `min_loss_tokens`):
whatever the finish reason, no empty row is ever kept.

A reply that loops (`loop`: the same phrases repeated over much of the reply, as a small model's greedy
decoding writes them: "a gentle rain, a gentle rain, a gentle rain, ...") is set aside: it would teach a draft
model to predict the loop. `loop_share` says what counts; a refrain between verses, a table, a list or code
whose lines share words repeat far less.

Token accounting: a server can report tokens it never put in the text (one that strips special tokens
answers content "" with completion_tokens = max_tokens; reasoning can come back in a field not read; a
stream can be cut). `lost_tokens` is what the engine reported beyond the tokens rebuilt for the row's
regenerated turns (`reply_tokens`, from the targets room); a row that lost more than the catalog's
`lost_text_tolerance` of the engine's count is `lost_text`. The engine's count is its completion tokens
(which include reasoning tokens in OpenAI-style usage), or its reasoning tokens when those are larger.
"""

from __future__ import annotations

import re

import polars as pl

from eagle_data.catalog import Checks

PASS = "pass"
TRUNCATED = "truncated"
LOST_TEXT = "lost_text"
LOOP = "loop"
SHORT_REASONS = ("empty_completion", "short_loss")  # what the empty_response gate counts
EMPTY_REPLY = "empty_reply"  # a failed row's error kind when its billed replies held no text (eagle_data/runner)
CONTAMINATED = "contaminated"
PROMPT_MISMATCH = "prompt_mismatch"  # the server rendered the prompt otherwise (another chat template)
CONTAMINATION = "contamination"  # the benchmark a row overlaps (eagle_data.quality.decontam), else null
# Tokens per regenerated turn an engine may count that the rebuilt text need not hold: the stop token,
# and the think tags and blank lines a template leaves out of an earlier turn it re-renders.
TURN_SLACK_TOKENS = 4
PROMPT_SLACK_TOKENS = 1  # per regenerated turn: a BOS a server counts without sending it, or the like
WRONG_VOCABULARY = "wrong_vocabulary"
PROMPT_COUNT_MISMATCH = "prompt_count_mismatch"
KEPT = frozenset({PASS, TRUNCATED})  # verdicts whose rows go to training
# Rejections the engine caused (an answer with no usable text, too little to train on, no reasoning where
# thinking was asked, text lost against the tokens it reported): another request may do better, so the
# generation asset's `retry_rejected` re-requests them. Structure and prompt faults are not among them.
ENGINE_SIDE_REJECTIONS = frozenset({"empty_completion", "short_loss", "missing_reasoning", LOST_TEXT})
STRUCTURE_REASONS = (
    "render_error",
    WRONG_VOCABULARY,
    "bad_structure",
    "roundtrip_mismatch",
    "prefix_mismatch",
    PROMPT_MISMATCH,
    PROMPT_COUNT_MISMATCH,
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


# Columns later stages added, null when a frame predates them: then no row is judged on them (token
# accounting inputs; the benchmark a row overlaps).
OPTIONAL_COLUMNS: dict[str, pl.DataType] = {
    CONTAMINATION: pl.String(),
    "reasoning_tokens": pl.Int64(),
    "reply_tokens": pl.Int32(),
    "reply_turns": pl.Int32(),
    "prompt_ok": pl.Boolean(),
    "prompt_tokens": pl.Int64(),
    "rendered_prompt_tokens": pl.Int64(),
    "vocab_ok": pl.Boolean(),
    "error": pl.String(),  # why a failed row failed, `kind: detail` (a billed empty reply: `empty_reply: ...`)
}
ACCOUNTING_COLUMNS = ("lost_tokens", "token_ratio")  # added by row_verdicts
CHECK_COLUMNS = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *ACCOUNTING_COLUMNS, "verdict")  # not token lists, messages


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


# A loop: at least LOOP_SHARE of a reply's LOOP_NGRAM-token phrases already occurred earlier in it, over at least
# LOOP_MIN_TOKENS tokens (words, CJK characters and runs of punctuation: "Risk-Risk-Risk" loops without a
# space). Long phrases only repeat verbatim: a table's rows, code's lines or a refrain share shorter runs. Tuned on
# SmolLM2-135M-Instruct's real replies and on human text (docs/quality.md#loops).
LOOP_SHARE = 0.5
LOOP_NGRAM = 8
LOOP_MIN_TOKENS = 40
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"  # written without spaces
_TOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+|[^\\w\\s]+")  # a CJK character, a word, a run of punctuation
_COUNTER = re.compile(r"(?m)^(\s*)\d+(?=[.)])")  # a numbered list's counter: "12. Use a timer" is "11. Use a timer"


def loop_share(text: str) -> float:
    """The share of the text's LOOP_NGRAM-token phrases that already occurred earlier in it (0 for a short text)."""
    tokens = _TOKEN.findall(_COUNTER.sub(r"\g<1>0", text))
    if len(tokens) < LOOP_MIN_TOKENS:
        return 0.0
    phrases = zip(*(tokens[k:] for k in range(LOOP_NGRAM)), strict=False)  # the token lists shifted: each phrase once
    return 1 - len(set(phrases)) / (len(tokens) - LOOP_NGRAM + 1)


def is_loop(text: str | None) -> bool:
    """Whether a reply loops: its own phrases make up at least LOOP_SHARE of it (see above)."""
    return loop_share(text or "") >= LOOP_SHARE


def error_kind() -> pl.Expr:
    """A failed row's error kind (`empty_reply` of `empty_reply: no content ...`), "" without one."""
    return pl.col("error").fill_null("").str.split(":").list.first().alias("error_kind")


def reported_tokens() -> pl.Expr:
    """What the engine says it generated (see the module docstring)."""
    return pl.max_horizontal(pl.col("completion_tokens").fill_null(0), pl.col("reasoning_tokens").fill_null(0))


def accounting() -> list[pl.Expr]:
    """`lost_tokens` (reported by the engine, missing from the rebuilt turns) and `token_ratio` (rebuilt
    over reported); both null where nothing can be compared: no reply, no rebuild, no reported count."""
    engine = reported_tokens()
    known = is_answered() & pl.col("reply_tokens").is_not_null() & (engine > 0)
    lost = engine - pl.col("reply_tokens") - TURN_SLACK_TOKENS * pl.col("reply_turns")
    return [
        pl.when(known).then(pl.max_horizontal(lost, 0)).cast(pl.Int64).alias("lost_tokens"),
        pl.when(known).then(pl.col("reply_tokens") / engine).alias("token_ratio"),
    ]


def prompt_count_off(checks: Checks) -> pl.Expr:
    """The server counted other prompt tokens than our rendering holds (beyond the slack): null-safe False."""
    ours, theirs = pl.col("rendered_prompt_tokens"), pl.col("prompt_tokens")
    turns = pl.col("reply_turns").fill_null(1)
    slack = pl.max_horizontal(PROMPT_SLACK_TOKENS * turns, checks.prompt_tokens_tolerance * ours)
    known = is_answered() & ours.is_not_null() & (theirs.fill_null(0) > 0)
    return (known & ((theirs - ours).abs() > slack)).fill_null(False)


def _rules(checks: Checks, thinking: bool) -> list[tuple[str, pl.Expr]]:
    """(reason, condition) in the order they are tried; the first that holds is the verdict."""
    nothing_written = _blank("content") & (_blank("reasoning") | ~is_truncated())  # a cut reply may hold only reasoning
    return [
        ("failed", pl.col("status") == "failed"),
        ("skipped_budget", pl.col("status") == "skipped_budget"),
        ("render_error", pl.col("target_error").fill_null("") != ""),  # the chat template refused the row
        (WRONG_VOCABULARY, _false("vocab_ok")),  # an id past the target's embedding: another model's ids
        # the server's own prompt ids differ from our rendering: the cause of whatever else breaks in the row (a
        # reply made under another template puts its control tokens elsewhere), and what the pre-flight names
        (PROMPT_MISMATCH, _false("prompt_ok")),
        ("bad_structure", _false("structure_ok")),
        ("roundtrip_mismatch", _false("roundtrip_ok")),
        ("prefix_mismatch", _false("prefix_ok")),
        # before the count: a server parses a user's literal `<|im_end|>` as one control token, we keep it text
        ("special_token_in_text", pl.col("special_in_text").fill_null(0) > 0),
        (PROMPT_COUNT_MISMATCH, prompt_count_off(checks)),  # the server counted another prompt
        (CONTAMINATED, pl.col(CONTAMINATION).is_not_null()),  # a benchmark's item in a prompt or reply
        (LOST_TEXT, pl.col("lost_tokens").fill_null(0) > checks.lost_text_tolerance * reported_tokens()),
        ("empty_completion", nothing_written),
        ("short_loss", pl.col("loss_tokens").fill_null(0) <= checks.min_loss_tokens),
        (LOOP, pl.col("content").map_elements(is_loop, return_dtype=pl.Boolean, skip_nulls=False)),
        (TRUNCATED, is_truncated()),
        ("missing_eot", _false("eot_ok")),
        ("missing_reasoning", _blank("reasoning") & pl.lit(thinking)),
    ]


def row_verdicts(frame: pl.DataFrame, checks: Checks, thinking: bool) -> pl.DataFrame:
    """`frame` with the accounting columns and a `verdict`: "pass" or the first reason from `_rules`."""
    require_columns(frame)
    missing = [pl.lit(None, dtype).alias(name) for name, dtype in OPTIONAL_COLUMNS.items() if name not in frame.columns]
    frame = frame.with_columns(missing).with_columns(accounting())
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
