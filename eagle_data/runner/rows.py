"""The generations frame: schema, conversation walk, and row building.

Columns follow the generation contract (docs/design.md), plus `messages` (the regenerated conversation),
`base_hash` and `max_tokens` (what resume needs to reuse ok rows after max_tokens is raised).
"""

from __future__ import annotations

from typing import Any, Literal

import polars as pl

from eagle_data.quality import sampled
from eagle_data.types import Completion, Message, Status

GEN_MESSAGES = pl.List(
    pl.Struct({"role": pl.String, "content": pl.String, "reasoning": pl.String, "output_ids": pl.List(pl.Int32)})
)
GENERATION_SCHEMA: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "dataset": pl.String(),
    "config_hash": pl.String(),
    "base_hash": pl.String(),
    "max_tokens": pl.Int64(),
    "engine": pl.String(),
    "model": pl.String(),
    "provider": pl.String(),
    "served_model": pl.String(),
    "sampling": pl.String(),
    "sampling_setting": pl.String(),
    "status": pl.String(),
    "finish_reason": pl.String(),
    "reasoning": pl.String(),
    "content": pl.String(),
    "output_ids": pl.List(pl.Int32),
    "prompt_ids": pl.List(pl.Int32),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "reasoning_tokens": pl.Int64(),
    "cost_usd": pl.Float64(),
    "latency_s": pl.Float64(),
    "attempts": pl.Int64(),
    "error": pl.String(),
    "finished_at": pl.Float64(),
    "messages": GEN_MESSAGES,
    sampled.COLUMN: sampled.DTYPE,  # the replies' sampled tokens' own log-probabilities, where the engine gave them
}
Row = dict[str, Any]


def plan_turns(messages: list[Message], regenerate: Literal["all", "first"], max_turns: int) -> list[list[Message]]:
    """Split a conversation into the segments sent before each regenerated reply.

    Original assistant turns are dropped (they get regenerated); a reply follows each user message
    not immediately followed by another user message; `first` keeps one reply, `all` up to
    `max_turns`. Messages after the last reply are dropped: the conversation ends on a reply.
    """
    cap = 1 if regenerate == "first" else max_turns
    segments: list[list[Message]] = []
    current: list[Message] = []
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant":
            continue
        current.append({"role": msg["role"], "content": msg["content"]})
        if msg["role"] == "user" and (i + 1 == len(messages) or messages[i + 1]["role"] != "user"):
            segments.append(current)
            current = []
            if len(segments) == cap:
                break
    return segments


def assistant_message(done: Completion) -> Message:
    msg: Message = {"role": "assistant", "content": done.content, "reasoning": done.reasoning}
    if done.output_ids is not None:
        msg["output_ids"] = done.output_ids
    return msg


def build_row(
    prompt_id: str,
    status: Status,
    conversation: list[Message],
    replies: list[Completion],
    *,
    attempts: int,
    latency_s: float,
    error: str,
    finished_at: float,
) -> Row:
    """One generations row (without the run-wide columns, which the runner adds when a row finishes)."""
    last = replies[-1] if replies else Completion(content="", finish_reason="")
    return {
        "prompt_id": prompt_id,
        "status": status,
        "provider": last.provider,
        "served_model": last.served_model,
        "finish_reason": last.finish_reason,
        "reasoning": last.reasoning,
        "content": last.content,
        "output_ids": last.output_ids,
        "prompt_ids": last.prompt_ids,
        "prompt_tokens": sum(r.prompt_tokens for r in replies),
        "completion_tokens": sum(r.completion_tokens for r in replies),
        "reasoning_tokens": sum(r.reasoning_tokens for r in replies),
        "cost_usd": sum(r.cost_usd for r in replies),
        "latency_s": latency_s,
        "attempts": attempts,
        "error": error,
        "finished_at": finished_at,
        sampled.COLUMN: sampled.added(r.sampled_logprobs for r in replies) if replies else None,
        "messages": [
            {
                "role": m["role"],
                "content": m["content"],
                "reasoning": m.get("reasoning", ""),
                "output_ids": m.get("output_ids"),
            }
            for m in conversation
        ],
    }


def to_frame(rows: list[Row]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=GENERATION_SCHEMA)
