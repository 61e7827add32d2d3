"""The prompt index: a dataset's normalized, de-duplicated, capped prompts, saved in blocks next to the shards.

Built streaming (rows normalized one batch at a time, written one block of `shard_size` rows at a time), so
memory stays flat whatever the source's size and a one-shard run reads only its own block. Keyed by the
source's content (`Source.identity`): the same content always gives the same shards (resume depends on that),
and a changed source rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import Adapter, DatasetSpec, shard_index
from eagle_data.sources.prompts import PROMPTS_SCHEMA, BadRow, SourceError, normalize, prompt_id
from eagle_data.sources.readers import Source, source_location
from eagle_data.storage import ShardStore

INDEX_SCHEMA = {k: v for k, v in PROMPTS_SCHEMA.items() if k != "shard"}
SUMMARY_VERSION = 2
FIELD_SAMPLE_ROWS = 1000  # rows whose field names are kept to explain a wrong schema


@dataclass
class IndexSummary:
    """What `_index/summary.json` holds: the index's figures, where its blocks are, what it was built from."""

    skipped: dict[str, int]
    rows_read: int
    source: str
    prompts: int = 0
    blocks: list[int] = field(default_factory=list)  # rows per block, in order
    digest: str = ""  # the blocks' folder: a hash of the settings and the source identity
    fingerprint: dict[str, Any] = field(default_factory=dict)  # the settings the index depends on
    content: dict[str, Any] | None = None  # the source identity it was built from
    fields: list[str] = field(default_factory=list)  # field names seen in the source's first rows
    turn_keys: list[str] = field(default_factory=list)  # keys seen inside their turns (messages adapters)
    version: int = SUMMARY_VERSION

    @classmethod
    def read(cls, raw: bytes) -> IndexSummary:
        """A saved summary; one written before the streaming index has no blocks and no content identity,
        so it never matches a source and is rebuilt (same prompts when the source is unchanged)."""
        data = json.loads(raw)
        if data.get("version") != SUMMARY_VERSION:
            data = {"skipped": data["skipped"], "rows_read": data["rows_read"], "source": data["source"],
                    "fingerprint": data.get("fingerprint", {}), "version": data.get("version", 1)}  # fmt: skip
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class PromptIndex:
    """The saved prompt index of one dataset: figures in memory, rows read block by block on demand."""

    store: ShardStore
    dataset: str
    summary: IndexSummary
    rebuilt: str = ""  # why this call rebuilt a saved index ("" when it was reused or built the first time)

    @property
    def skipped(self) -> dict[str, int]:
        return self.summary.skipped

    @property
    def rows_read(self) -> int:
        return self.summary.rows_read

    @property
    def source(self) -> str:
        return self.summary.source

    @property
    def prompts(self) -> int:
        return self.summary.prompts

    def blocks(self) -> Iterator[pl.DataFrame]:
        """Every prompt of the dataset (without `shard`), one saved block at a time."""
        for block in range(len(self.summary.blocks)):
            yield self.store.read_frame(layout.index_block(self.dataset, self.summary.digest, block))

    def shard(self, spec: DatasetSpec, partition: str) -> pl.DataFrame:
        """Shard `partition`: rows `[i*shard_size, (i+1)*shard_size)`, read from the blocks that hold them."""
        index = shard_index(partition)
        part = self._rows(index * spec.shard_size, spec.shard_size)
        return part.with_columns(pl.lit(index, pl.Int32).alias("shard")).select(list(PROMPTS_SCHEMA))

    def _rows(self, offset: int, length: int) -> pl.DataFrame:
        frames, start = [], 0
        for block, rows in enumerate(self.summary.blocks):
            if start < offset + length and offset < start + rows:
                frame = self.store.read_frame(layout.index_block(self.dataset, self.summary.digest, block))
                low, high = max(offset - start, 0), min(offset + length - start, rows)
                frames.append(frame.slice(low, high - low))
            start += rows
        return pl.concat(frames) if frames else pl.DataFrame(schema=INDEX_SCHEMA)


def _fingerprint(spec: DatasetSpec, location: str) -> dict[str, Any]:
    """What the index's contents depend on besides the source content; a saved index built under other
    settings is refused (shards cut from it would hold other prompts than the settings say)."""
    return {
        "source": location,
        "adapter": spec.adapter.model_dump(),
        "max_prompts": spec.max_prompts,
        "max_prompt_chars": spec.max_prompt_chars,
    }


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def build_index(spec: DatasetSpec, store: ShardStore, source: Source) -> IndexSummary:
    """Stream the source into blocks of `shard_size` prompts under a new digest; returns the summary
    (not yet saved: the caller saves it once the index is judged usable)."""
    content = source.identity()
    fingerprint = _fingerprint(spec, source.location)
    summary = IndexSummary(
        skipped={}, rows_read=0, source=source.location, fingerprint=fingerprint, content=content,
        digest=_digest({"fingerprint": fingerprint, "content": content}),
    )  # fmt: skip
    skipped: Counter[str] = Counter()
    fields: set[str] = set()
    turn_keys: set[str] = set()
    seen: set[str] = set()
    block: list[dict[str, Any]] = []

    def flush() -> None:
        frame = pl.DataFrame(block, schema=INDEX_SCHEMA)
        store.write_frame(layout.index_block(spec.name, summary.digest, len(summary.blocks)), frame)
        summary.blocks.append(frame.height)
        block.clear()

    for row_number, row in enumerate(source.rows()):
        if summary.prompts >= spec.max_prompts:
            break
        summary.rows_read += 1
        if row_number < FIELD_SAMPLE_ROWS:
            _note_fields(row, spec.adapter, fields, turn_keys)
        if row.get("__malformed__") or row.get("__bad_encoding__"):
            skipped["bad_encoding" if row.get("__bad_encoding__") else "malformed_row"] += 1
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
        block.append(
            {
                "prompt_id": pid,
                "dataset": spec.name,
                "messages": messages,
                "source_id": str(source_id) if source_id is not None else str(row_number),
                "source_row": row_number,
            }
        )
        summary.prompts += 1
        if len(block) >= spec.shard_size:
            flush()
    if block:
        flush()
    summary.skipped = dict(sorted(skipped.items()))
    summary.fields, summary.turn_keys = sorted(fields), sorted(turn_keys)
    return summary


def _note_fields(row: dict[str, Any], adapter: Adapter, fields: set[str], turn_keys: set[str]) -> None:
    fields.update(k for k in row if not k.startswith("__"))
    turns = row.get(adapter.messages_field or "")
    if isinstance(turns, list):
        turn_keys.update(k for t in turns[:4] if isinstance(t, dict) for k in t)


def _expected(adapter: Adapter) -> str:
    if adapter.messages_field is not None:
        want = f"{adapter.messages_field!r} (a list of turns with {adapter.role_key!r}/{adapter.content_key!r})"
    else:
        want = repr(adapter.prompt_field) + (f" and {adapter.response_field!r}" if adapter.response_field else "")
    return want + (f", optional {adapter.system_field!r}" if adapter.system_field else "")


def check_yield(spec: DatasetSpec, summary: IndexSummary) -> None:
    """Refuse an index that yields no prompt, or that skipped more than `max_skipped_share` of the rows:
    a wrong schema or a broken file must fail the prompts step, not feed an empty or thin dataset."""
    if summary.rows_read == 0:
        raise SourceError(
            f"dataset {spec.name!r}: source {summary.source} has no rows; pass a file with rows in the source's schema"
        )
    skipped = sum(summary.skipped.values())
    if summary.prompts and skipped <= spec.max_skipped_share * summary.rows_read:
        return
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(summary.skipped.items(), key=lambda kv: -kv[1]))
    found = ", ".join(summary.fields) or "none"
    turns = f"; its turns have keys {', '.join(summary.turn_keys)}" if summary.turn_keys else ""
    raise SourceError(
        f"dataset {spec.name!r}: {summary.prompts} prompts from {summary.rows_read} rows of {summary.source} "
        f"({skipped} skipped: {reasons}; max_skipped_share {spec.max_skipped_share:g}). The adapter expects "
        f"{_expected(spec.adapter)}; the rows have fields {found}{turns}. Fix the catalog adapter or the file"
    )


def load_index(spec: DatasetSpec, store: ShardStore, source_path: str | None = None) -> PromptIndex:
    """The saved prompt index, or build and save it from the source when there is none, or when the
    source's content changed since it was built.

    A saved index built under other settings (another source location, adapter, cap) is refused, not
    reused or replaced: shards already cut from it would silently hold other prompts than the settings say.
    An index that fails `check_yield` is never saved.
    """
    source = Source(spec, source_location(spec, source_path), store.s3_client)
    summary_key = layout.index_file(spec.name, "summary.json")
    fingerprint = _fingerprint(spec, source.location)
    saved = IndexSummary.read(store.read_bytes(summary_key)) if store.exists(summary_key) else None
    rebuilt = ""
    if saved is not None:
        changed = sorted(k for k, v in fingerprint.items() if saved.fingerprint.get(k) != v)
        if changed:
            raise SourceError(
                f"dataset {spec.name!r}: its saved prompt index under {store.root} was built with other "
                f"{', '.join(changed)}; use another EAGLE_DATA_ROOT, or delete "
                f"{store.uri(layout.index_prefix(spec.name))} to rebuild it (shards written from the old index no "
                "longer match)"
            )
        if saved.version == SUMMARY_VERSION and source.same_content(saved.content):
            check_yield(spec, saved)
            return PromptIndex(store, spec.name, saved)
        if saved.content is not None:
            rebuilt = f"source {source.location} changed since its prompt index was built ({_change(saved, source)})"
    summary = build_index(spec, store, source)
    check_yield(spec, summary)
    store.write_bytes(summary_key, json.dumps(asdict(summary)).encode())
    _drop_other_blocks(store, spec.name, summary.digest)
    return PromptIndex(store, spec.name, summary, rebuilt)


def _change(saved: IndexSummary, source: Source) -> str:
    before, now = saved.content or {}, source.identity() or {}
    return ", ".join(f"{k} {before.get(k)} -> {v}" for k, v in now.items() if before.get(k) != v)


def _drop_other_blocks(store: ShardStore, dataset: str, digest: str) -> None:
    """Delete blocks of earlier builds (and a pre-streaming single-file index) once the new summary is saved."""
    for key in store.list(layout.index_prefix(dataset)):
        where = layout.parse(key)
        stale_block = where is not None and where.kind == "index_block" and where.name != digest
        if stale_block or (where is not None and where.name == "prompts.parquet"):
            store.delete(key)
