"""What the OpenAI-compatible stand-in answers with: a reply in each shape real servers use for reasoning, and the
token ids vLLM returns with `return_token_ids` (the ChatML rendering in Qwen's vocabulary)."""

from __future__ import annotations

import random
import zlib
from typing import Any

from eagle_data.targets.vocab import qwen_tokenizer

# The words of a healthy reply, each one Qwen token with or without a leading space, drawn per turn: varied text,
# since a reply of one word repeated is a loop the quality gates set aside (eagle_data/quality/verdicts.py).
REPLY_WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "this", "it",
    "an", "be", "are", "or", "have", "not", "but", "his", "they", "all", "which", "one", "had", "were", "their",
    "has", "more", "new", "can", "will", "also", "would", "about", "other", "there", "been", "some", "time", "two",
    "like", "people", "first", "into", "its", "only", "after", "may", "over", "most", "years", "many", "such",
    "these", "when", "where", "who", "what",
)
# Reply shapes servers use. "split": OpenRouter's `reasoning` string beside `content`; "details": only
# OpenRouter's typed `reasoning_details` parts (with an encrypted part that has no text); "reasoning_content":
# SGLang's and older vLLM's field; "think_inline": no reasoning parser, a think block inside `content`;
# "null_content": `content` null, no reasoning, finish "stop"; "special_only": the model emitted only
# special tokens the server stripped: content "", finish "length", completion_tokens = max_tokens.
SHAPES = ("split", "details", "reasoning_content", "think_inline", "null_content", "special_only")


def shaped_message(shape: str, content: str, reasoning: str) -> dict[str, Any]:
    """The assistant message of one reply in the given shape (see SHAPES)."""
    message: dict[str, Any] = {"role": "assistant"}
    if shape == "split":
        return {**message, "content": content, "reasoning": reasoning}
    if shape == "details":
        parts = [{"type": "reasoning.encrypted", "data": "b64=="}, {"type": "reasoning.text", "text": reasoning},
                 {"type": "reasoning.summary", "summary": " (summary)"}]  # fmt: skip
        return {**message, "content": content, "reasoning": None, "reasoning_details": parts}
    if shape == "reasoning_content":
        return {**message, "content": content, "reasoning_content": reasoning}
    if shape == "think_inline":
        return {**message, "content": f"<think>\n{reasoning}\n</think>\n\n{content}"}
    if shape == "null_content":
        return {**message, "content": None}
    if shape == "special_only":
        return {**message, "content": ""}
    raise ValueError(f"unknown reply shape {shape!r}; known: {SHAPES}")


def fake_reply(turn: str, n: int) -> str:
    """A healthy reply of `n` tokens to one turn (`prompt_id#turn`), the same on every request."""
    rng = random.Random(zlib.crc32(turn.encode()))
    return " ".join(rng.choice(REPLY_WORDS) for _ in range(n))


def token_ids(
    messages: list[dict[str, Any]], message: dict[str, Any], finish: str, thinking: bool = True
) -> tuple[list[int], list[int]]:
    """(prompt ids, reply ids) as vLLM returns them for a Qwen3 model: the ChatML rendering of the
    conversation (with thinking off, an empty think block after it) and of the reply (its think block, its
    content, `<|im_end|>` unless cut), in Qwen's vocabulary."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    prompt = turns + "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
    thought = message.get("reasoning") or message.get("reasoning_content")
    reply = (f"<think>\n{thought}\n</think>\n\n" if thought else "") + (message.get("content") or "")
    reply += "<|im_end|>" if finish == "stop" else ""
    encode = qwen_tokenizer().encode
    return encode(prompt, add_special_tokens=False).ids, encode(reply, add_special_tokens=False).ids



def chat_logprobs(ids: list[int], k: int) -> list[dict[str, Any]]:
    """OpenAI's chat `logprobs.content` for a reply of `ids`, with made-up values: each token's text and
    log-probability, and the k most likely in descending order (OpenAI's and SGLang's order: the sampled token listed
    only where it is one of the k); every fourth token is the second most likely, the others the most likely."""
    decode = qwen_tokenizer().decode
    out = []
    for i, token in enumerate(ids):
        rank, text = (1 if i % 4 == 3 else 0), decode([token])
        values = [-0.25 - j for j in range(max(k, rank + 1))]  # most likely first; the sampled token at `rank`
        names = [text if j == rank else f"<other {j}>" for j in range(len(values))]
        top = [logprob_entry(name, value) for name, value in zip(names, values, strict=True)][:k]
        out.append({**logprob_entry(text, values[rank]), "top_logprobs": top})
    return out


def logprob_entry(text: str, value: float) -> dict[str, Any]:
    """One token of OpenAI's chat logprobs: its text, log-probability and UTF-8 bytes."""
    return {"token": text, "logprob": value, "bytes": list(text.encode())}
