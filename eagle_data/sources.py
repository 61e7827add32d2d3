"""Read a prompt source (the hub, a local parquet/JSONL file, or the bundled sample) and normalize it.

Every row becomes a conversation `[{role, content}]` with roles system/user/assistant, a stable
`prompt_id` (hash of dataset + normalized messages), or a counted skip reason. The normalized,
de-duplicated, capped list is the *prompt index*: shard `i` is rows `[i*shard_size, (i+1)*shard_size)`.
The index is saved once next to the shards, so a shard's prompts never change between runs even if the
upstream dataset does — resume depends on that.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import Adapter, DatasetSpec, shard_index
from eagle_data.storage import ShardStore
from eagle_data.types import Message

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


class SourceError(RuntimeError):
    """The source cannot be read at all; the message names the dataset, the location and the fix."""


class BadRow(ValueError):
    """A row that cannot become a prompt; `reason` is the counter label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PromptIndex:
    """All normalized prompts of a dataset in source order, and what was skipped on the way."""

    frame: pl.DataFrame  # PROMPTS_SCHEMA without `shard`
    skipped: dict[str, int]
    rows_read: int
    source: str

    def shard(self, spec: DatasetSpec, partition: str) -> pl.DataFrame:
        index = shard_index(partition)
        part = self.frame.slice(index * spec.shard_size, spec.shard_size)
        return part.with_columns(pl.lit(index, pl.Int32).alias("shard")).select(list(PROMPTS_SCHEMA))


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
        messages.append({"role": ROLE_MAP[role.lower()], "content": content})

    if not any(m["role"] == "user" for m in messages):
        raise BadRow("no_user_turn")
    first = 1 if messages[0]["role"] == "system" else 0
    if messages[first]["role"] != "user" or any(m["role"] == "system" for m in messages[first:]):
        raise BadRow("bad_turn_order")
    if sum(len(m["content"]) for m in messages if m["role"] != "assistant") > max_prompt_chars:
        raise BadRow("prompt_too_long")
    return messages


def source_location(spec: DatasetSpec, override: str | None = None) -> str:
    """Where the rows come from: an explicit path, the bundled sample, a catalog path, or the hub."""
    if override:
        return override
    if spec.source == "sample":
        return str(spec.sample_path)
    if spec.source:
        return spec.source
    if not spec.hub_id:
        raise SourceError(f"dataset {spec.name!r} has neither hub_id nor source in the catalog; set one")
    return f"hf://datasets/{spec.hub_id}@~parquet/{spec.config or 'default'}/{spec.split}/*.parquet"


def read_rows(spec: DatasetSpec, location: str) -> Iterator[dict[str, Any]]:
    """Yield raw source rows as dicts. JSONL is read line by line so one malformed line is a counted skip."""
    if location.startswith("hf://"):
        try:
            frame = pl.read_parquet(location)
        except Exception as exc:
            raise SourceError(
                f"dataset {spec.name!r}: cannot read {location} ({type(exc).__name__}); check the network and "
                f"hub id, or pass a local file (source_path) — e.g. EAGLE_DATA_PROFILE=demo uses the bundled sample"
            ) from None
        yield from frame.iter_rows(named=True)
        return
    path = Path(location).expanduser()
    if not path.is_file():
        raise SourceError(
            f"dataset {spec.name!r}: source file {path} not found; fix the path (catalog `source` or the "
            "prompts asset's source_path config) or download the dataset there"
        )
    if path.suffix == ".parquet":
        yield from pl.read_parquet(path).iter_rows(named=True)
        return
    if path.suffix not in (".jsonl", ".json"):
        raise SourceError(f"dataset {spec.name!r}: {path} is neither .parquet nor .jsonl")
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = {"__malformed__": True}
            yield row if isinstance(row, dict) else {"__malformed__": True}


def build_index(spec: DatasetSpec, location: str) -> PromptIndex:
    skipped: Counter[str] = Counter()
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    rows_read = 0
    for row_number, row in enumerate(read_rows(spec, location)):
        if len(records) >= spec.max_prompts:
            break
        rows_read += 1
        if row.get("__malformed__"):
            skipped["malformed_row"] += 1
            continue
        try:
            messages = normalize(row, spec.adapter, spec.max_prompt_chars)
        except BadRow as bad:
            skipped[bad.reason] += 1
            continue
        pid = prompt_id(spec.name, messages)
        if pid in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(pid)
        source_id = row.get(spec.adapter.id_field) if spec.adapter.id_field else None
        records.append(
            {
                "prompt_id": pid,
                "dataset": spec.name,
                "messages": messages,
                "source_id": str(source_id) if source_id is not None else str(row_number),
                "source_row": row_number,
            }
        )
    schema = {k: v for k, v in PROMPTS_SCHEMA.items() if k != "shard"}
    frame = pl.DataFrame(records, schema=schema)
    return PromptIndex(frame=frame, skipped=dict(sorted(skipped.items())), rows_read=rows_read, source=location)


def _index_keys(spec: DatasetSpec) -> tuple[str, str]:
    return layout.index_file(spec.name, "prompts.parquet"), layout.index_file(spec.name, "summary.json")


def _fingerprint(spec: DatasetSpec, location: str) -> dict[str, Any]:
    """What the index's contents depend on; a saved index is reused only while all of it is unchanged."""
    return {
        "source": location,
        "adapter": spec.adapter.model_dump(),
        "max_prompts": spec.max_prompts,
        "max_prompt_chars": spec.max_prompt_chars,
    }


def load_index(spec: DatasetSpec, store: ShardStore, source_path: str | None = None) -> PromptIndex:
    """The saved prompt index, or build and save it from the source on first use.

    A saved index built under other settings (another source, adapter, cap) is refused, not reused:
    shards cut from it would silently hold other prompts than the settings say.
    """
    frame_key, summary_key = _index_keys(spec)
    location = source_location(spec, source_path)
    fingerprint = _fingerprint(spec, location)
    if store.exists(frame_key) and store.exists(summary_key):
        summary = json.loads(store.read_bytes(summary_key))
        changed = sorted(k for k, v in fingerprint.items() if summary.get("fingerprint", {}).get(k) != v)
        if changed:
            raise SourceError(
                f"dataset {spec.name!r}: its saved prompt index under {store.root} was built with other "
                f"{', '.join(changed)}; use another EAGLE_DATA_ROOT, or delete {store.uri(frame_key)} to rebuild "
                "it (shards written from the old index no longer match)"
            )
        return PromptIndex(store.read_frame(frame_key), summary["skipped"], summary["rows_read"], summary["source"])
    index = build_index(spec, location)
    store.write_frame(frame_key, index.frame)
    summary = {
        "skipped": index.skipped,
        "rows_read": index.rows_read,
        "source": index.source,
        "fingerprint": fingerprint,
    }
    store.write_bytes(summary_key, json.dumps(summary).encode())
    return index
