"""The verdict on one reply as it arrives: the cheap part of the row verdicts (`verdicts.py`), judged
before any tokenizer runs, so the runner's breaker can stop a run that turned bad within minutes.

Same names and thresholds as the row verdicts, tried in a fixed order:
- `empty_completion`: no answer text (content blank; reasoning blank too, unless the reply was cut). A
  reply cut at max_tokens with no text at all is `lost_text` instead: the model was still writing when it
  was cut, so the server dropped every token it billed (`transformers serve` does so when a model writes
  `<|endoftext|>` in a Qwen reply: its response parser ends the content there, usage counts the rest).
- `lost_text`: the engine reported more tokens than the text can hold. Every token of a byte-level BPE
  or byte-fallback vocabulary decodes to at least one byte, so a reply's text holds at least as many
  UTF-8 bytes as it has tokens, save the few special tokens a server strips (`TURN_SLACK_TOKENS`). A
  reply whose bytes fall short of the reported tokens by more than `lost_text_tolerance` lost text (one
  real server answered 1 character for 20 completion tokens). Any row this flags, the row verdict does
  too, since a rebuilt turn holds no more tokens than its text has bytes.
- `short_loss`: reported completion tokens at or under `min_loss_tokens` (a reply of "OK.").
- `loop`: half or more of the text's phrases repeat earlier ones (`verdicts.is_loop`, the row verdict's own
  test), cut at max_tokens or not.
- `truncated`: cut at max_tokens (`finish_reason` "length"); no end of turn.
Empty is tried before lost text (unlike the row verdicts) so a reply with no text at all is named for
what it is; both are rejected either way.
"""

from __future__ import annotations

from eagle_data.catalog import Checks
from eagle_data.quality.verdicts import LOOP, LOST_TEXT, PASS, TRUNCATED, TURN_SLACK_TOKENS, is_loop
from eagle_data.types import Completion

EMPTY = "empty_completion"
SHORT = "short_loss"
REPEAT = "repeat"  # a window-level verdict: one completion answering too many replies (the breaker's)
# Paid for, nothing to train on: asked again (the catalog's breaker.empty_retries), then recorded failed.
BILLED_REJECTS = frozenset({EMPTY, LOST_TEXT})


def reported_tokens(done: Completion) -> int:
    """What the engine says it generated (as the row verdicts read it)."""
    return max(done.completion_tokens, done.reasoning_tokens)


def reply_verdict(done: Completion, checks: Checks) -> str:
    """`pass`, or the first reason (see the module docstring) this reply is unfit for training."""
    content, reasoning = done.content.strip(), done.reasoning.strip()
    reported = reported_tokens(done)
    if not content and (not reasoning or not done.truncated):
        return LOST_TEXT if done.truncated and reported > TURN_SLACK_TOKENS else EMPTY
    held = len(done.content.encode()) + len(done.reasoning.encode()) + TURN_SLACK_TOKENS
    if held < (1 - checks.lost_text_tolerance) * reported:
        return LOST_TEXT
    if 0 < done.completion_tokens <= checks.min_loss_tokens:
        return SHORT
    if is_loop(done.content):
        return LOOP
    return TRUNCATED if done.truncated else PASS
