"""Reading a chat reply's text: reasoning and content, whatever shape the server used.

Servers put the reasoning in different places: OpenRouter in `message.reasoning` and in the typed
parts of `message.reasoning_details` (`reasoning.text` with `text`, `reasoning.summary` with
`summary`; `reasoning.encrypted` carries no readable text and is skipped), SGLang's and older vLLM's
reasoning parsers in `message.reasoning_content`, newer vLLM in `message.reasoning`, and a server
without a reasoning parser leaves a `<think>…</think>` block at the start of `content`.
"""

from __future__ import annotations

from typing import Any

from eagle_data.types import FatalError, encodable

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
DETAIL_TEXT_FIELDS = {"reasoning.text": "text", "reasoning.summary": "summary"}


def _details_text(details: Any) -> str:
    if not isinstance(details, list):
        return ""
    parts = [d.get(DETAIL_TEXT_FIELDS.get(d.get("type", ""), ""), "") for d in details if isinstance(d, dict)]
    return "".join(p for p in parts if isinstance(p, str))


def split_think(content: str) -> tuple[str, str]:
    """(reasoning, content) of a content string that may hold a think block.

    `<think>r</think>c` and `r</think>c` (the template opened the block in the prompt) split at the
    closing tag; an opened block that never closes (cut off while thinking) is all reasoning.
    """
    head = content.lstrip()
    if THINK_CLOSE in content and (head.startswith(THINK_OPEN) or THINK_OPEN not in content):
        reasoning, _, rest = content.partition(THINK_CLOSE)
        return reasoning.lstrip().removeprefix(THINK_OPEN).strip("\n"), rest.lstrip("\n")
    if head.startswith(THINK_OPEN):
        return head.removeprefix(THINK_OPEN).strip("\n"), ""
    return "", content


def reply_text(message: dict[str, Any]) -> tuple[str, str]:
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
    inline, content = split_think(content)
    if not (encodable(content) and encodable(reasoning or inline)):
        raise FatalError("the reply holds text that is not valid Unicode (a lone surrogate)", kind="bad_encoding")
    return (reasoning or inline), content
