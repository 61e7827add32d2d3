"""One source row -> a conversation `[{role, content}]` with roles system/user/assistant and a stable
`prompt_id` (hash of dataset + normalized messages), or a counted skip reason (`BadRow`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import polars as pl

from eagle_data.catalog import Adapter
from eagle_data.types import Message, UserError, encodable

ROLE_MAP = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
}

MESSAGES_SCHEMA = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
PROMPTS_SCHEMA = {
    "prompt_id": pl.String,
    "dataset": pl.String,
    "shard": pl.Int32,
    "messages": MESSAGES_SCHEMA,
    "source_id": pl.String,
    "source_row": pl.Int64,
}


class SourceError(UserError, RuntimeError):
    """The source cannot be read at all; the message names the dataset, the location and the fix."""


class BadRow(ValueError):
    """A row that cannot become a prompt; `reason` is the counter label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def prompt_id(dataset: str, messages: list[Message]) -> str:
    payload = json.dumps([dataset, [[m["role"], m["content"]] for m in messages]], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def normalize(row: dict[str, Any], adapter: Adapter, max_prompt_chars: int) -> list[Message]:
    """One source row -> a conversation, or BadRow with the reason it was skipped."""
    if adapter.prompt_field is not None:
        turns = [("user", row.get(adapter.prompt_field))]
        if adapter.response_field is not None and row.get(adapter.response_field) is not None:
            turns.append(("assistant", row.get(adapter.response_field)))
    else:
        raw = row.get(adapter.messages_field or "")
        if not isinstance(raw, list):
            raise BadRow("no_user_turn")
        turns = [
            (t.get(adapter.role_key), t.get(adapter.content_key)) if isinstance(t, dict) else (None, None) for t in raw
        ]
    system = row.get(adapter.system_field) if adapter.system_field else None
    if isinstance(system, str) and system.strip():
        turns.insert(0, ("system", system))

    messages: list[Message] = []
    for role, content in turns:
        if not isinstance(role, str) or role.lower() not in ROLE_MAP:
            raise BadRow("unknown_role")
        if not isinstance(content, str):
            raise BadRow("non_string_content")
        if not content.strip():
            raise BadRow("empty_content")
        if not encodable(content):  # a lone surrogate escaped in the JSON: no file or shard can hold it
            raise BadRow("bad_encoding")
        messages.append({"role": ROLE_MAP[role.lower()], "content": content})

    if not any(m["role"] == "user" for m in messages):
        raise BadRow("no_user_turn")
    first = 1 if messages[0]["role"] == "system" else 0
    if messages[first]["role"] != "user" or any(m["role"] == "system" for m in messages[first:]):
        raise BadRow("bad_turn_order")
    if sum(len(m["content"]) for m in messages if m["role"] != "assistant") > max_prompt_chars:
        raise BadRow("prompt_too_long")
    return messages
