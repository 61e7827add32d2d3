"""The durable result log: what makes resume exact and keeps a SIGKILL from paying twice.

Every answered turn (one engine reply) is a *turn record*: prompt_id, turn index, the resume-key
hashes, the reply and its usage. Turn records become durable in batches at most `flush_every_s` apart
(0.5 s by default), so every answer is durable within a second of landing:
  - folder: one append-only file per shard per run, `{ds}/{ds}/_log/{partition}/turns-{run}.jsonl`,
    each batch appended and fsync'd;
  - S3 (no append): one small part object per batch, `turns-{run}-{seq}.jsonl`, per open shard.
A SIGKILL loses only the batch not yet written: at most `flush_every_s` of answers are paid again.
A multi-turn conversation is durable turn by turn, so a failed turn 2 never pays for turn 1 again.

A finished shard is written whole to `{ds}/{ds}/{partition}.parquet` (a sample run, `write_shards`
False, writes its rows to `part-*.parquet` instead), then the logs are compacted: the turns of
conversations that did not finish (failed, stopped) move to one `carry-*.jsonl`, the rest are dropped.
Handed over (`hand_over`, the Dagster asset's run), the finished shard's rows become one part whose
sequence number is HANDED (the result log still holds them) until the IO manager writes its bytes as the
shard file (and its digest record) and `commit_handed` renames the part `kept.parquet`: a kill in between
loses nothing and pays nothing again. The kept copy stays until the partition's next finished shard replaces
it, so a stored shard that is later missing, torn or changed (its bytes no longer the recorded digest) is
moved aside and rebuilt from it: re-materializing the partition sends no request.

Resume, keyed by content (prompt_id + config hash + turn index), never by position:
  - rows (shard file and parts) are reused when
      - their `config_hash` equals the current one and they are ok or truncated (final), or
      - they are ok, their `base_hash` (the config without max tokens) matches, and they were
        generated with `max_tokens` <= the current cap: a reply that stopped on its own under a lower
        cap is exactly what a higher cap allows, so raising max_tokens re-generates only truncated rows;
  - a prompt without a reusable row replays its stored turns in order by the same rules (a turn that
    hit the old cap is not replayed under a raised one) and continues from the first missing turn.
Failed and skipped_budget rows are never reused: the next run retries them, from their stored turns.
Only usable replies are reused or replayed: a row or turn without text (an empty reply stored by an
older version), or with text that cannot be stored (a lone surrogate), is requested again. A row that
still holds such text when its shard is written (e.g. in an error message) is written failed,
`bad_encoding`: one poison reply never keeps a shard from being written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.runner.rows import GENERATION_SCHEMA, Row, to_frame
from eagle_data.stage_table import GENERATION
from eagle_data.storage import CorruptFile, ShardStore
from eagle_data.storage.digests import ChangedFile, FileDigest, check, recorded_shard
from eagle_data.types import Completion, encodable

MAX_TOKENS_KEYS = ("max_tokens", "max_new_tokens", "max_completion_tokens")
Turn = dict[str, Any]  # one turn record: TURN_KEYS, then the Completion's fields
log = logging.getLogger(__name__)
HANDED = 0  # the part sequence number of a finished shard's rows handed over to the IO manager
TURN_KEYS = ("prompt_id", "turn", "config_hash", "base_hash", "max_tokens", "attempts", "latency_s", "finished_at")


@dataclass(frozen=True)
class ResumeKey:
    config_hash: str
    base_hash: str
    max_tokens: int


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resume_key(engine_config: dict[str, Any], spec: DatasetSpec) -> ResumeKey:
    """Hash of everything that changes the output: the engine's config and the catalog settings of the stage
    table's generation record (the same that make its code version); `base_hash` leaves out the max-tokens cap."""
    settings = GENERATION.values(spec)
    payload = {"engine": engine_config, **settings}
    base = {
        **payload,
        "engine": {k: v for k, v in engine_config.items() if k not in MAX_TOKENS_KEYS},
        "generation": {k: v for k, v in settings["generation"].items() if k not in MAX_TOKENS_KEYS},
    }
    cap = next((int(engine_config[k]) for k in MAX_TOKENS_KEYS if k in engine_config), spec.generation.max_tokens)
    return ResumeKey(_digest(payload), _digest(base), cap)


def _has_text(content: pl.Expr, reasoning: pl.Expr) -> pl.Expr:
    return (content.fill_null("").str.strip_chars() != "") | (reasoning.fill_null("").str.strip_chars() != "")


def usable() -> pl.Expr:
    """A reply worth keeping: its last reply and every regenerated assistant turn carry text."""
    turn = pl.element()
    blank_turn = (turn.struct.field("role") == "assistant") & ~_has_text(
        turn.struct.field("content"), turn.struct.field("reasoning")
    )
    no_blank_turn = ~pl.col("messages").list.eval(blank_turn).list.any().fill_null(False)
    return _has_text(pl.col("content"), pl.col("reasoning")) & no_blank_turn


def reusable(frame: pl.DataFrame, key: ResumeKey) -> pl.DataFrame:
    """The stored rows the current config may keep: the latest reusable row per prompt_id."""
    same = (pl.col("config_hash") == key.config_hash) & pl.col("status").is_in(["ok", "truncated"])
    raised = (
        (pl.col("status") == "ok") & (pl.col("base_hash") == key.base_hash) & (pl.col("max_tokens") <= key.max_tokens)
    )
    return (
        frame.filter((same | raised) & usable())
        .sort("finished_at")
        .unique("prompt_id", keep="last", maintain_order=True)
        .with_columns(pl.lit(key.config_hash).alias("config_hash"))
    )


def replayable(turns: Iterable[Turn], key: ResumeKey) -> dict[str, list[Turn]]:
    """Per prompt_id, the stored turns the current config may replay: turn 0, 1, ... without a gap,
    the latest usable record of each turn."""
    best: dict[tuple[str, int], Turn] = {}
    for turn in turns:
        same = turn["config_hash"] == key.config_hash
        raised = (
            turn["base_hash"] == key.base_hash
            and turn["finish_reason"] != "length"
            and turn["max_tokens"] <= key.max_tokens
        )
        text = (str(turn.get("content") or ""), str(turn.get("reasoning") or ""))
        has_text = (text[0].strip() or text[1].strip()) and all(map(encodable, text))
        at = (turn["prompt_id"], turn["turn"])
        if (same or raised) and has_text and (at not in best or turn["finished_at"] >= best[at]["finished_at"]):
            best[at] = turn
    chains: dict[str, list[Turn]] = {}
    for prompt_id, index in sorted(best):
        chain = chains.setdefault(prompt_id, [])
        if index == len(chain):
            chain.append(best[prompt_id, index])
    return chains


def turn_record(prompt_id: str, index: int, key: ResumeKey, done: Completion, attempts: int, latency_s: float) -> Turn:
    record = {
        "prompt_id": prompt_id,
        "turn": index,
        "config_hash": key.config_hash,
        "base_hash": key.base_hash,
        "max_tokens": key.max_tokens,
        "attempts": attempts,
        "latency_s": latency_s,
        "finished_at": time.time(),
    }
    record.update(vars(done))
    return record


def completion_of(turn: Turn) -> Completion:
    return Completion(**{k: v for k, v in turn.items() if k not in TURN_KEYS})


BAD_ENCODING = "bad_encoding: the row holds text that is not valid Unicode (a lone surrogate)"


def _storable(row: Row) -> Row:
    """`row`, or a failed row in its place when some text in it cannot be stored."""
    try:
        json.dumps(row, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        blank = dict.fromkeys(("provider", "served_model", "finish_reason", "reasoning", "content"), "")
        return {**row, **blank, "status": "failed", "error": BAD_ENCODING, "output_ids": None, "messages": []}
    return row


def _rows_frame(rows: list[Row]) -> pl.DataFrame:
    """The rows as a frame; checked row by row only when a whole-frame build meets unstorable text."""
    try:
        return to_frame(rows)
    except UnicodeEncodeError:
        return to_frame([_storable(r) for r in rows])


def _encode(turns: list[Turn]) -> bytes:
    return "".join(json.dumps(t, separators=(",", ":")) + "\n" for t in turns).encode()


def _kind(key: str) -> str:
    parsed = layout.parse(key)
    return parsed.kind if parsed else ""


def _turn(line: bytes) -> Turn | None:
    """One turn record, or None for a line that is not one (torn by a kill mid-write, garbage)."""
    try:
        turn = json.loads(line)
        completion_of(turn)
    except (ValueError, TypeError, AttributeError):
        return None
    return turn if set(TURN_KEYS) <= set(turn) else None


def _decode(store: ShardStore, key: str) -> list[Turn]:
    """Turn records of one log. A last line cut short by a kill mid-write is dropped; any other line that
    is not a turn record (a torn line the next batch was appended to, garbage) is skipped with a warning
    naming the file: its turn, if any, is requested again."""
    lines = store.read_bytes(key).split(b"\n")
    turns = [_turn(line) for line in lines[:-1] if line]
    if skipped := turns.count(None):
        log.warning("%s: skipped %d unreadable line(s) of %d; their turns are requested again", store.uri(key),
                    skipped, len(turns))  # fmt: skip
    return [t for t in turns if t is not None]


def _read_part(store: ShardStore, key: str, recorded: FileDigest | None = None) -> pl.DataFrame | None:
    """A stored rows file (checkpoint part, final shard, kept copy); None after moving aside one that is
    unreadable or not the `recorded` bytes, with a warning naming both names: its rows are rebuilt from the
    kept copy or the turn logs, or requested again."""
    data = store.read_bytes(key)
    try:
        check(store.uri(key), FileDigest.of(data), recorded, "")
        return store.frame_of(key, data)
    except (CorruptFile, ChangedFile) as exc:
        why = f"is {exc.why}" if isinstance(exc, CorruptFile) else exc.what
        aside = store.move_aside(key)
        log.warning("%s %s; moved aside to %s; its rows are rebuilt from the kept copy or the turn logs, or "
                    "requested again", store.uri(key), why, store.uri(aside))  # fmt: skip
        return None


class ResultLog:
    """The turn logs, checkpoint parts and final shard of one partition, written by one run."""

    def __init__(self, store: ShardStore, dataset: str, partition: str, run: str = "") -> None:
        self.store, self.dataset, self.partition = store, dataset, partition
        self.prefix = layout.log_prefix(dataset, partition)
        self.run = run or f"{time.time_ns():020d}-{os.getpid()}"
        self._seq = 0

    def load(self) -> pl.DataFrame:
        """Every stored row of this partition: the last final shard (or, when it is missing, torn or changed
        since it was stored, its kept copy) plus all checkpoint parts."""
        keys = [k for k in self.store.list(self.prefix) if _kind(k) == "log_part"]
        found = [f for k in keys if (f := _read_part(self.store, k)) is not None]
        if (shard := self.stored_shard()) is not None:
            found.append(shard)
        frames = [f.select([c for c in GENERATION_SCHEMA if c in f.columns]) for f in found]
        return pl.concat(frames, how="diagonal_relaxed") if frames else to_frame([])

    def stored_shard(self) -> pl.DataFrame | None:
        """The stored shard's rows, read only when they are the recorded bytes; else those of its kept copy."""
        recorded = recorded_shard(self.store, self.dataset, self.dataset, self.partition)
        shard = layout.shard(self.dataset, self.dataset, self.partition)
        for key in (shard, layout.kept(self.dataset, self.partition)):
            if self.store.exists(key) and (frame := _read_part(self.store, key, recorded)) is not None:
                return frame
        return None

    def load_turns(self) -> list[Turn]:
        """Every stored turn record of this partition (turn logs of every run, carried turns)."""
        keys = [k for k in self.store.list(self.prefix) if _kind(k) in ("turn_log", "turn_carry")]
        return [turn for key in keys for turn in _decode(self.store, key)]

    def append_turns(self, turns: list[Turn]) -> None:
        """Make `turns` durable: appended and fsync'd, or one part object on S3 (blocking)."""
        if self.store.can_append:
            self.store.append_bytes(layout.turn_log(self.dataset, self.partition, self.run), _encode(turns))
        else:
            self._seq += 1
            self.store.write_bytes(layout.turn_log(self.dataset, self.partition, self.run, self._seq), _encode(turns))

    def finalize(self, rows: list[Row], carry: list[Turn], *, whole: bool, hand_over: bool = False) -> str:
        """Write the rows, then compact the logs they supersede (blocking).

        `whole`: the rows are the whole shard, written with its usage sidecar; checkpoint parts go too.
        With `hand_over` they become the HANDED part instead (the old shard's usage sidecar goes: the part
        counts them now). Otherwise (a sample) they become one more part. Turns of unfinished conversations
        (`carry`) are kept in one carry file, so their next run replays them.
        """
        superseded = [k for k in self.store.list(self.prefix) if whole or _kind(k) in ("turn_log", "turn_carry")]
        written: set[str] = set()
        frame = _rows_frame(rows)
        if whole and hand_over:
            written.add(part := layout.log_part(self.dataset, self.partition, time.time_ns(), os.getpid(), HANDED))
            uri = self.store.write_frame(part, frame)
            self.store.delete(layout.usage(self.dataset, self.partition))
        elif whole:
            uri = self.store.write_shard(self.dataset, self.dataset, self.partition, frame)
            usage = {"tokens": _tokens(frame), "cost_usd": float(frame["cost_usd"].sum())}
            self.store.write_bytes(layout.usage(self.dataset, self.partition), json.dumps(usage).encode())
        elif rows:
            written.add(part := layout.log_part(self.dataset, self.partition, time.time_ns(), os.getpid(), 1))
            uri = self.store.write_frame(part, frame)
        else:
            uri = ""
        if carry:
            written.add(carried := layout.turn_carry(self.dataset, self.partition, self.run))
            self.store.write_bytes(carried, _encode(carry))
        for key in superseded:
            if key not in written:
                self.store.delete(key)
        return uri

    def handed(self) -> str | None:
        """The key of the latest HANDED part (a finished shard's rows not yet in its shard file), if any."""
        handed = f"-{HANDED:06d}.parquet"
        keys = [k for k in self.store.list(self.prefix) if _kind(k) == "log_part" and k.endswith(handed)]
        return keys[-1] if keys else None

    def commit_handed(self, part: str) -> None:
        """The shard file now holds the HANDED part's rows: write its usage sidecar, then keep the part as the
        shard's kept copy (a kill between the two counts its spend twice for the budget until the next run
        compacts: never less). The copy is what a missing or changed shard is rebuilt from, unpaid."""
        frame = self.store.read_frame(part).select("prompt_tokens", "completion_tokens", "cost_usd")
        usage = {"tokens": _tokens(frame), "cost_usd": float(frame["cost_usd"].sum())}
        self.store.write_bytes(layout.usage(self.dataset, self.partition), json.dumps(usage).encode())
        self.store.move(part, layout.kept(self.dataset, self.partition))


def _tokens(frame: pl.DataFrame) -> int:
    return int(frame["prompt_tokens"].sum() + frame["completion_tokens"].sum())


def stored_usage(store: ShardStore, dataset: str) -> tuple[int, float]:
    """Tokens and dollars stored for `dataset`, every partition: budgets are per dataset, and a range
    run counts its own partitions' stored spend up front instead of holding every shard open.

    Finished shards count through their small usage sidecar (no shard download per call on S3);
    checkpoint parts and turn logs of unfinished shards are read. Carried turns are already counted in
    the failed rows that hold them.
    """
    tokens, usd = 0, 0.0
    for key in store.list(layout.asset_prefix(dataset, layout.generation_asset(dataset))):
        where = layout.parse(key)
        if where is None:
            continue
        if where.kind == "usage":
            usage = json.loads(store.read_bytes(key))
            tokens, usd = tokens + usage["tokens"], usd + usage["cost_usd"]
        elif where.kind == "log_part" and (frame := _read_part(store, key)) is not None:
            tokens, usd = tokens + _tokens(frame), usd + float(frame["cost_usd"].sum())
        elif where.kind == "turn_log":
            turns = _decode(store, key)
            tokens += sum(t["prompt_tokens"] + t["completion_tokens"] for t in turns)
            usd += sum(t["cost_usd"] for t in turns)
    return tokens, usd
