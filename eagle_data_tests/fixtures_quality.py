"""Validated-shaped frames for the quality tests, with real Qwen3 token ids.

Each row is a one-turn ChatML conversation. The loss mask starts after the `<think>` that ends the
generation prompt (as in templates whose prompt ends in `<think>`), so the empty reply
`<think>\\n\\n</think>\\n\\nOK.<|im_end|>` has a loss-mask sum of 6, as in the real incident.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import polars as pl

from eagle_data.targets.vocab import qwen_tokenizer

EMPTY_REPLY_LOSS = 6
_SENTENCES = (
    "the model reads each prompt and writes a careful answer about code data tokens shards loss masks "
    "python function returns list values sorted order because first second then finally check result "
    "speculative decoding draft target accepts proposal"
)
_WORDS = _SENTENCES.split()


@dataclass(frozen=True)
class Reply:
    """One generation outcome to turn into a validated row."""

    question: str
    reasoning: str = ""
    content: str = ""
    status: str = "ok"  # ok | truncated | failed | skipped_budget


def _row(i: int, r: Reply, dataset: str) -> dict[str, object]:
    tok = qwen_tokenizer()
    prompt = f"<|im_start|>user\n{r.question}<|im_end|>\n<|im_start|>assistant\n<think>"
    answered = r.status in ("ok", "truncated")
    reply = f"\n{r.reasoning}\n</think>\n\n{r.content}" if r.reasoning else f"\n\n</think>\n\n{r.content}"
    reply += "<|im_end|>" if r.status == "ok" else ""
    prompt_ids = tok.encode(prompt, add_special_tokens=False).ids
    reply_ids = tok.encode(reply, add_special_tokens=False).ids if answered else []
    ids = prompt_ids + reply_ids
    flag = True if answered else None
    return {
        "prompt_id": f"{dataset}-{i:05d}",
        "dataset": dataset,
        "status": r.status,
        "finish_reason": {"ok": "stop", "truncated": "length"}.get(r.status, ""),
        "content": r.content if answered else "",
        "reasoning": r.reasoning if answered else "",
        "completion_tokens": len(reply_ids),
        "reasoning_tokens": 0,  # not reported apart, as many OpenAI-compatible servers do
        "input_ids": ids,
        "loss_mask": [0] * len(prompt_ids) + [1] * len(reply_ids),
        "num_tokens": len(ids),
        "loss_tokens": len(reply_ids),
        "roundtrip_ok": tok.decode(ids, skip_special_tokens=False) == prompt + reply if answered else None,
        "prefix_ok": flag,
        "structure_ok": flag,
        "special_in_text": 0,
        "eot_ok": (r.status == "ok") if answered else None,
        "ids_match": None,  # the fixture's "engine" returned no ids
        "target_error": "",
        "reply_tokens": len(reply_ids) if answered else None,  # the engine reported exactly what the text holds
        "reply_turns": 1 if answered else None,
    }


def validated_frame(replies: list[Reply], dataset: str = "fixture") -> pl.DataFrame:
    """A frame with the columns of targets.build_training_rows' output."""
    rows = [_row(i, r, dataset) for i, r in enumerate(replies)]
    return pl.DataFrame(
        rows,
        schema_overrides={
            "input_ids": pl.List(pl.Int32),
            "loss_mask": pl.List(pl.UInt8),
            "ids_match": pl.Boolean,
            "reply_tokens": pl.Int32,
            "reply_turns": pl.Int32,
        },
        infer_schema_length=None,
    )


def set_rows(frame: pl.DataFrame, rows: list[int], **values: object) -> pl.DataFrame:
    """`frame` with the given columns overwritten on the given row numbers."""
    hit = pl.int_range(pl.len()).is_in(rows)
    return frame.with_columns(
        pl.when(hit).then(pl.lit(v, dtype=frame.schema[k])).otherwise(pl.col(k)).alias(k) for k, v in values.items()
    )


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def varied_replies(n: int, seed: int = 0) -> list[Reply]:
    """Healthy replies: reasoning and answers of varied length, no two alike."""
    rng = random.Random(seed)
    return [
        Reply(
            f"Question {i}: {_text(rng, 12)}",
            _text(rng, rng.randint(20, 160)),
            _text(rng, rng.randint(15, 240)),
        )
        for i in range(n)
    ]


def clean_frame(n: int = 200, seed: int = 0, dataset: str = "fixture") -> pl.DataFrame:
    """Passes every check: 1% truncated, 0.5% failed (both under their limits), the rest healthy."""
    replies = varied_replies(n, seed)
    replies[3] = Reply(replies[3].question, replies[3].reasoning, replies[3].content, "truncated")
    replies[7] = Reply(replies[7].question, replies[7].reasoning, replies[7].content, "truncated")
    replies[11] = Reply(replies[11].question, status="failed")
    return validated_frame(replies, dataset)


def generation_frame(
    n: int = 200, empty_share: float = 0.87, dataset: str = "fixture", thinking: bool = True
) -> pl.DataFrame:
    """A generation shard (the contract in docs/design.md) where `empty_share` of replies are the empty "OK.", for
    tests that run the real validation stage (token ids by the targets room) in front of the checks; without
    `thinking`, as a server with thinking off answers: no reasoning."""
    from eagle_data.targets.rows import MESSAGE_DTYPE

    replies = varied_replies(n)
    if not thinking:
        replies = [Reply(r.question, "", r.content, r.status) for r in replies]
    empty = round(n * empty_share)
    replies[:empty] = [Reply(r.question, "", "OK.") for r in replies[:empty]]
    rows = [
        {
            "prompt_id": f"{dataset}-{i:05d}",
            "dataset": dataset,
            "config_hash": "fixture",
            "engine": "fixture",
            "model": "fixture",
            "status": "ok",
            "finish_reason": "stop",
            "content": r.content,
            "reasoning": r.reasoning,
            "completion_tokens": len(r.content.split()) + len(r.reasoning.split()),
            "messages": [
                {"role": "user", "content": r.question, "reasoning": None, "output_ids": None},
                {"role": "assistant", "content": r.content, "reasoning": r.reasoning, "output_ids": None},
            ],
        }
        for i, r in enumerate(replies)
    ]
    return pl.DataFrame(rows, schema_overrides={"messages": pl.List(MESSAGE_DTYPE)})


def regression_frame(n: int = 200, empty_share: float = 0.87, seed: int = 0, dataset: str = "fixture") -> pl.DataFrame:
    """The real incident: `empty_share` of rows are the empty "OK." reply (loss-mask sum 6)."""
    replies = varied_replies(n, seed)
    empty = round(n * empty_share)
    replies[:empty] = [Reply(r.question, "", "OK.") for r in replies[:empty]]
    return validated_frame(replies, dataset)
