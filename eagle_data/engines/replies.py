"""Reading a reply's text: reasoning and content, whatever shape the server used. The one reasoning split.

Servers put the reasoning in different places: OpenRouter in `message.reasoning` and in the typed
parts of `message.reasoning_details` (`reasoning.text` with `text`, `reasoning.summary` with
`summary`; `reasoning.encrypted` carries no readable text and is skipped), SGLang's and older vLLM's
reasoning parsers in `message.reasoning_content`, newer vLLM in `message.reasoning`, and a server
without a reasoning parser leaves a think block at the start of `content`.

A think block in a reply is split by one rule, over text (`split_text`) or over the model's own token ids
(`split_ids`, where the engine has them), with the target profile's markers (`eagle_data.targets.
reasoning_markers`): the reasoning runs to the closing marker, after an opening marker at the start (or
none, when the prompt opened the block); an opened block that never closes (cut off while thinking) is
all reasoning; anything else is all content (an opening marker inside the answer is only a mention).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers
from eagle_data.types import Completion, FatalError, encodable

DETAIL_TEXT_FIELDS = {"reasoning.text": "text", "reasoning.summary": "summary"}
Piece = TypeVar("Piece", str, int)


def _details_text(details: Any) -> str:
    if not isinstance(details, list):
        return ""
    parts = [d.get(DETAIL_TEXT_FIELDS.get(d.get("type", ""), ""), "") for d in details if isinstance(d, dict)]
    return "".join(p for p in parts if isinstance(p, str))


def _spans(
    pieces: Sequence[Piece], opening: Piece, closing: Piece, *, cut_while_thinking: bool = False
) -> tuple[slice, slice] | None:
    """(reasoning, content) spans of a reply seen as pieces in which each marker is one piece (blank text
    pieces before the block are skipped); None when it holds no think block. `cut_while_thinking`: a reply
    with no marker at all is reasoning (the prompt opened the block and the reply was cut off in it)."""
    lead = next((i for i, piece in enumerate(pieces) if not isinstance(piece, str) or piece.strip()), len(pieces))
    opened = lead < len(pieces) and pieces[lead] == opening
    start = lead + opened
    rest = list(pieces[start:])
    if closing in rest:
        at = start + rest.index(closing)
        if opened or opening not in pieces[:at]:
            return slice(start, at), slice(at + 1, len(pieces))
    elif opened or cut_while_thinking:
        return slice(start, len(pieces)), slice(len(pieces), len(pieces))
    return None


def split_text(content: str, markers: ReasoningMarkers | None) -> tuple[str, str]:
    """(reasoning, content) of a content string that may hold a think block (None: a format without one)."""
    if markers is None:
        return "", content
    tags = f"({re.escape(markers.open_text)}|{re.escape(markers.close_text)})"
    pieces = [piece for piece in re.split(tags, content) if piece]
    spans = _spans(pieces, markers.open_text, markers.close_text)
    if spans is None:
        return "", content
    reasoning, answer = ("".join(pieces[span]) for span in spans)
    return reasoning.strip(markers.strip_reasoning), answer.lstrip(markers.strip_content)


def split_ids(
    ids: list[int], markers: ReasoningMarkers | None, decode: Callable[[list[int]], str], *, cut_while_thinking: bool
) -> tuple[str, str, int]:
    """(reasoning, content, reasoning_tokens) of a reply's own token ids (its end-of-turn id removed);
    `reasoning_tokens` counts the ids of the block, markers included."""
    strip_content = markers.strip_content if markers else ""
    spans = None
    if markers is not None and markers.open_id is not None and markers.close_id is not None:
        spans = _spans(ids, markers.open_id, markers.close_id, cut_while_thinking=cut_while_thinking)
    if markers is None or spans is None:
        return "", decode(ids).lstrip(strip_content), 0
    reasoning, answer = spans
    tokens = min(len(ids), reasoning.stop + 1)  # through the closing marker, or every id when it never closed
    return decode(ids[reasoning]).strip(markers.strip_reasoning), decode(ids[answer]).lstrip(strip_content), tokens


def completion_from_ids(
    tokenizer: Any, output_ids: list[int], prompt_ids: list[int], markers: ReasoningMarkers | None, provider: str
) -> Completion:
    """A checkpoint's own reply ids (the local engine's, SGLang's offline engine's) as a Completion: split into
    reasoning and content at the think-block markers (their ids in the checkpoint's own vocabulary); the
    end-of-turn id stays in output_ids, and ending on it is what "stop" means."""
    stopped = bool(output_ids) and output_ids[-1] == tokenizer.eos_token_id
    body = output_ids[:-1] if stopped else output_ids
    if markers is not None:
        ids = tokenizer.convert_tokens_to_ids([markers.open_text, markers.close_text])
        markers = replace(markers, open_id=ids[0], close_id=ids[1])
    reasoning, content, reasoning_tokens = split_ids(body, markers, tokenizer.decode, cut_while_thinking=False)
    return Completion(
        content=content,
        reasoning=reasoning,
        reasoning_tokens=reasoning_tokens,
        finish_reason="stop" if stopped else "length",
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(output_ids),
        output_ids=output_ids,
        prompt_ids=prompt_ids,
        provider=provider,
    )


def reply_text(message: dict[str, Any], markers: ReasoningMarkers | None = THINK_TAGS) -> tuple[str, str]:
    """(reasoning, content) of one chat `message`; null fields read as "". Text that cannot be stored (a lone
    surrogate escaped in the JSON) fails the reply as `bad_encoding`: that row fails, never the shard."""
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    reasoning = ""
    for name in ("reasoning", "reasoning_content"):
        value = message.get(name)
        if isinstance(value, str) and value.strip():
            reasoning = value
            break
    else:
        reasoning = _details_text(message.get("reasoning_details"))
    inline, content = split_text(content, markers)
    if not (encodable(content) and encodable(reasoning or inline)):
        raise FatalError("the reply holds text that is not valid Unicode (a lone surrogate)", kind="bad_encoding")
    return (reasoning or inline), content
