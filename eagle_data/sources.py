"""Read a prompt source (the hub, a local or S3 parquet/JSONL file, or the bundled sample), normalize it.

Every row becomes a conversation `[{role, content}]` with roles system/user/assistant, a stable
`prompt_id` (hash of dataset + normalized messages), or a counted skip reason. The normalized,
de-duplicated, capped list is the *prompt index*: shard `i` is rows `[i*shard_size, (i+1)*shard_size)`.

The index is built streaming (the source read in batches, rows normalized one batch at a time, written
one block of `shard_size` rows at a time), so memory stays flat whatever the source's size, and a
one-shard run reads only its own block. It is saved next to the shards and keyed by the source's
content (a local file's size, mtime and SHA-256; an S3 object's ETag; a hub dataset's revision): the
same content always gives the same shards (resume depends on that), and a changed source rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import Adapter, DatasetSpec, shard_index
from eagle_data.storage import ShardStore
from eagle_data.storage.s3 import default_client
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



INDEX_SCHEMA = {k: v for k, v in PROMPTS_SCHEMA.items() if k != "shard"}
SUMMARY_VERSION = 2
BATCH_ROWS = 2048  # source rows per batch read from a parquet file
FIELD_SAMPLE_ROWS = 1000  # rows whose field names are kept to explain a wrong schema
HASH_CHUNK = 1 << 20


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



# ---- where the rows come from --------------------------------------------------------------------
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


@dataclass(frozen=True)
class Source:
    """One source location and how to read it: its content identity, and its rows as a stream."""

    spec: DatasetSpec
    location: str
    s3_client: Callable[[], Any] = default_client  # for s3:// sources: the store's own client (its settings)

    def identity(self) -> dict[str, Any] | None:
        """What identifies the content: a local file's size, mtime and SHA-256 (the hash only when asked
        by `same_content`), an S3 object's ETag, a hub dataset's revision; None when it cannot be told."""
        if self.location.startswith("hf://"):
            revision = _hub_revision(self.spec.hub_id or "")
            return {"revision": revision} if revision else None
        if self.location.startswith("s3://"):
            head = self._s3_head()
            return {"etag": head["ETag"], "size": head["ContentLength"]}
        path = self._local_path()
        stat = path.stat()
        times = {"mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}
        return {"size": stat.st_size, **times, "sha256": _sha256(path)}

    def same_content(self, saved: dict[str, Any] | None) -> bool:
        """Whether the source still holds the content `saved` was taken from. A local file whose size, mtime
        and ctime are unchanged is not re-hashed (so a big file costs a stat); any other same-size file is
        compared by its SHA-256. The ctime is what makes this safe: the kernel sets it on every write and
        no call sets it back, so an edit that restores the mtime (`touch -d`, `cp -p`) is still hashed. A
        source that cannot be looked at (a hub revision offline, a local file since removed, e.g. on another
        machine sharing an S3 root) counts as unchanged: the saved index stands, and nothing else needs it."""
        if self.location.startswith(("hf://", "s3://")):
            now = self.identity()
            return now is None or now == saved
        if saved is None:
            return False
        path = Path(self.location).expanduser()
        if not path.is_file():
            return True
        stat = path.stat()
        quick = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if quick == (saved.get("size"), saved.get("mtime_ns"), saved.get("ctime_ns")):
            return True
        return stat.st_size == saved.get("size") and _sha256(path) == saved.get("sha256")

    def rows(self) -> Iterator[dict[str, Any]]:
        """Raw source rows as dicts, streamed. A JSONL line that is not JSON, not an object or not UTF-8
        is a counted skip (`malformed_row`, `bad_encoding`), never a reason to reject the file; so is a
        row whose text holds a lone surrogate (`bad_encoding`, from `normalize`)."""
        if self.location.startswith("hf://"):
            yield from self._parquet_rows(self.location, self.location)
        elif self.location.startswith("s3://"):
            with tempfile.TemporaryDirectory(prefix="eagle-source-") as tmp:
                local = Path(tmp, Path(self.location).name)
                bucket, key = layout.s3_root(self.location)
                self._client().download_file(bucket, key, str(local))
                yield from self._file_rows(local)
        else:
            yield from self._file_rows(self._local_path())

    # ---- readers ---------------------------------------------------------------------------------
    def _file_rows(self, path: Path) -> Iterator[dict[str, Any]]:
        if path.suffix == ".parquet":
            yield from self._parquet_rows(str(path), self.location)
        elif path.suffix in (".jsonl", ".json"):
            yield from _jsonl_rows(path)
        else:
            raise SourceError(f"dataset {self.spec.name!r}: {self.location} is neither .parquet nor .jsonl")

    def _parquet_rows(self, path: str, shown: str) -> Iterator[dict[str, Any]]:
        try:
            for batch in pl.scan_parquet(path).collect_batches(chunk_size=BATCH_ROWS):
                yield from batch.iter_rows(named=True)
        except (pl.exceptions.PolarsError, OSError) as exc:
            if shown.startswith("hf://"):
                raise SourceError(
                    f"dataset {self.spec.name!r}: cannot read {shown} ({type(exc).__name__}); check the network "
                    "and hub id, or pass a local file (source_path) — e.g. EAGLE_DATA_PROFILE=demo uses the "
                    "bundled sample"
                ) from None
            size = Path(path).stat().st_size if Path(path).is_file() else 0
            raise SourceError(
                f"dataset {self.spec.name!r}: {shown} ({size} bytes) is not a complete parquet file "
                f"({_first_line(exc)}); re-download or re-export it"
            ) from None

    def _local_path(self) -> Path:
        path = Path(self.location).expanduser()
        if not path.is_file():
            raise SourceError(
                f"dataset {self.spec.name!r}: source file {path} not found; fix the path (catalog `source` or the "
                "prompts asset's source_path config) or download the dataset there"
            )
        return path

    def _client(self) -> Any:
        return self.s3_client()

    def _s3_head(self) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = layout.s3_root(self.location)
        try:
            return self._client().head_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise SourceError(
                f"dataset {self.spec.name!r}: cannot read source object {self.location} ({_first_line(exc)}); "
                "fix the location or the S3 credentials and endpoint"
            ) from None


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for raw in fh:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield {"__bad_encoding__": True}
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = {"__malformed__": True}
            yield row if isinstance(row, dict) else {"__malformed__": True}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _hub_revision(hub_id: str) -> str | None:
    """The commit of the hub dataset's parquet conversion, or None offline (then the saved index stands)."""
    try:
        from huggingface_hub import HfApi

        refs = HfApi().list_repo_refs(hub_id, repo_type="dataset")
        return next((ref.target_commit for ref in refs.converts if ref.name == "parquet"), None)
    except Exception:  # offline, unknown id, rate limit: the content cannot be told, which is not an error here
        return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


# ---- the prompt index ----------------------------------------------------------------------------
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
            f"dataset {spec.name!r}: source {summary.source} has no rows; pass a file with rows in the "
            "source's schema"
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
