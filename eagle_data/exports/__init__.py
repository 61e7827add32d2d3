"""What leaves the pipeline for draft-model trainers, built from `{ds}_validated` shards (pure).

- Per dataset, the trainer files chosen in the catalog (`exports.formats.FORMATS`: SpecForge's pre-tokenized
  `prompts.jsonl` by default, its text `conversations.jsonl`, EAGLE's ShareGPT `sharegpt.jsonl`) and
  `train.parquet` (ours: prompt_id, dataset, input_ids, loss_mask, provenance).
- A training mix across datasets with per-dataset weights, reproducible from a seed (`mix.parquet`, ours,
  and the tokenized formats' files for the whole mix, in mix order).

Only shards the gate admitted are read (`admit`, over the quality records on storage: every blocking check's
stored outcome passed on the very bytes validation stored, matched by digest), only if their bytes are the
ones those checks judged (`Admission.digests`, hashed as they are read), and of those only the rows that pass
three looks on the way out: the verdict
stored at validation, a fresh verdict under today's catalog thresholds (both must keep the row; a
threshold tightened since validation takes effect without re-validating), and a look at the tokens
themselves (`verify`), so no export can hold a zero-mask row whatever happened upstream.

Everything streams, so memory stays flat from ten thousand rows to a million: a dataset's files are
written one shard at a time, and the mix, whose rows go out in a seeded random order, is written in
buckets of output positions (rows are spilled to a local file, tagged by the bucket they land in, then
each bucket is read back, sorted and appended). The order is exactly that of shuffling the whole mix in memory with
`random.Random(seed)`: only the permutation of row numbers (8 bytes a row) is held in memory.
"""

from __future__ import annotations

import array
import io
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from polars.io.plugins import register_io_source

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.exports.formats import FORMATS, TRAINING_SCHEMA, to_training_parquet
from eagle_data.quality import KEPT, row_verdicts, split_rows
from eagle_data.quality.records import Judged
from eagle_data.quality.verdicts import REQUIRED_COLUMNS as JUDGED_COLUMNS
from eagle_data.report import stored_record
from eagle_data.storage import ShardStore
from eagle_data.storage.digests import FileDigest
from eagle_data.storage.shards import shards_written
from eagle_data.types import UserError

TRAINING_COLUMNS = ("prompt_id", "dataset", "input_ids", "loss_mask")
STRUCTURE_FLAGS = ("structure_ok", "roundtrip_ok", "prefix_ok")  # False: the ids are not the target's
REQUIRED_COLUMNS = tuple(dict.fromkeys((*TRAINING_COLUMNS, "messages", "verdict", *JUDGED_COLUMNS)))
ROW_GROUP_ROWS = 1024  # parquet row groups of the exports: small enough that writing them stays flat
READERS = 16  # quality records the gate reads at once
BUCKET_BYTES = 8 << 20  # rows of the mix held at once while writing it, in bytes of token lists


class ExportError(UserError, RuntimeError):
    """An export that must not succeed; the message is one line that says what to do."""


@dataclass(frozen=True)
class Admission:
    """The validated shards of one dataset an export may read, and those it must leave out, with why."""

    admitted: tuple[str, ...] = ()
    excluded: Mapping[str, str] = field(default_factory=dict)  # partition -> reason
    # partition -> sha256 and size of the shard bytes the checks judged; an admitted shard whose bytes differ now
    # (rewritten by a validation run that stopped part-way, or by hand) is left out
    digests: Mapping[str, FileDigest] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredShard:
    """A validated shard's quality record as admission reads it: the digest of the bytes validation stored
    (None: recorded by an older version) and every check's stored outcome, by name."""

    digest: FileDigest | None
    outcomes: Mapping[str, Judged]


@dataclass(frozen=True)
class GateRecords:
    """What the gate of one dataset's export looks at, all of it read from storage."""

    blocking: tuple[str, ...]  # names of the blocking checks
    on_storage: frozenset[str]  # partitions whose validated shard file exists
    records: Mapping[str, StoredShard]  # partition -> its current quality record (absent: none, or another schema)


def _check_reason(record: StoredShard, check: str) -> str | None:
    """Why one blocking check keeps the shard out, or None when it lets it in."""
    outcome = record.outcomes.get(check)
    if outcome is None:
        return f"{check} never ran on this shard; run the checks"
    if record.digest is None or outcome.shard_sha256 != record.digest.sha256:
        return f"{check} last ran on other bytes of this shard; re-run the checks"
    if not outcome.passed:
        said = outcome.message.splitlines()[0] if outcome.message else ""
        run = f" in run {outcome.run_id[:8]}" if outcome.run_id else ""
        return f"{check} failed{run}" + (f": {said}" if said else "")
    return None


def admit(records: GateRecords) -> Admission:
    """The shards an export may read: on storage, with a quality record that holds the digest of the bytes
    validation stored, and a passed outcome of every blocking check judged on those very bytes (identities:
    partition and digest, never a run's order or an event's number); every other shard with why it is out."""
    admitted, excluded = [], {}
    for partition in sorted(records.on_storage | set(records.records)):
        record = records.records.get(partition)
        if partition not in records.on_storage:
            excluded[partition] = "its shard file is missing from storage; re-materialize it"
        elif record is None:
            excluded[partition] = "it has no quality record of this version; re-run its checks"
        elif record.digest is None:
            excluded[partition] = "its quality record holds no shard digest (an older version); re-run its checks"
        elif reasons := [reason for check in records.blocking if (reason := _check_reason(record, check))]:
            excluded[partition] = "; ".join(reasons)
        else:
            admitted.append(partition)
    digests = {p: d for p in admitted if (d := records.records[p].digest) is not None}
    return Admission(tuple(admitted), excluded, digests)


def gate_records(spec: DatasetSpec, store: ShardStore, blocking: Sequence[str]) -> GateRecords:
    """What `admit` judges for `spec`'s validated shards, gated by the `blocking` checks: the shard files on
    storage and their quality records, as stored (a stale record is rebuilt by the checks, not here)."""
    stored = frozenset(shards_written(store, spec.name, layout.validated_asset(spec.name)))
    parsed = (layout.parse(key) for key in store.list(layout.quality_prefix(spec.name)))
    partitions = [key.partition for key in parsed if key is not None and key.kind == "quality_record"]
    with ThreadPoolExecutor(READERS) as pool:  # one small GET each on S3: read side by side
        found = dict(zip(partitions, pool.map(lambda p: stored_record(spec, store, p), partitions), strict=True))
    records = {
        partition: StoredShard(FileDigest(r.shard_sha256, r.shard_size) if r.shard_sha256 else None, r.outcomes())
        for partition, r in found.items()
        if r is not None
    }
    return GateRecords(tuple(blocking), stored, records)


@dataclass
class Written:
    """What one dataset's export files hold."""

    rows: int = 0
    tokens: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # kept by the verdicts, refused by `verify`


def passed(validated: pl.DataFrame) -> pl.DataFrame:
    """The rows the quality verdicts keep for training ("pass", and "truncated": the model's own tokens)."""
    return split_rows(validated)[0]


def rejudged(rows: pl.DataFrame, spec: DatasetSpec) -> tuple[pl.DataFrame, Counter[str]]:
    """`rows` (kept at validation) without those today's thresholds would set aside, and how many, by verdict."""
    fresh = row_verdicts(rows, spec.checks, spec.generation.thinking)["verdict"]
    keep = fresh.is_in(list(KEPT))
    return rows.filter(keep), Counter(dict(fresh.filter(~keep).value_counts().iter_rows()))


def _false(column: str) -> pl.Expr:
    return pl.col(column).eq(False).fill_null(False)


def _refusals(min_loss_tokens: int) -> list[tuple[str, pl.Expr]]:
    """(reason, condition) of the last look at a row before it leaves; the first that holds counts."""
    return [
        ("bad_structure", pl.any_horizontal(*(_false(f) for f in STRUCTURE_FLAGS), pl.col("target_error") != "")),
        ("length_mismatch", pl.col("input_ids").list.len().fill_null(0) != pl.col("loss_mask").list.len().fill_null(0)),
        ("short_loss", pl.col("loss_mask").list.sum().fill_null(0) <= min_loss_tokens),
    ]


def verify(rows: pl.DataFrame, min_loss_tokens: int) -> tuple[pl.DataFrame, Counter[str]]:
    """`rows` without those whose tokens are unfit for training, and how many were refused, by reason.

    Checked on the token lists themselves, not on the columns the verdicts read: structure flags, ids
    and mask of equal length, loss-mask sum above `min_loss_tokens`."""
    reason: pl.Expr = pl.lit(None, pl.String)
    for name, condition in reversed(_refusals(min_loss_tokens)):
        reason = pl.when(condition).then(pl.lit(name)).otherwise(reason)
    judged = rows.with_columns(reason.alias("_refused"))
    refused = judged.filter(pl.col("_refused").is_not_null())["_refused"].value_counts()
    kept = judged.filter(pl.col("_refused").is_null()).drop("_refused")
    return kept, Counter(dict(refused.iter_rows()))


def exportable(validated: pl.DataFrame, spec: DatasetSpec) -> tuple[pl.DataFrame, Counter[str]]:
    """The rows of a validated shard that go to training: kept by the stored verdicts and by fresh ones,
    then verified; with the count of rows the stored verdicts kept but the last two looks refused."""
    missing = [c for c in REQUIRED_COLUMNS if c not in validated.columns]
    if missing:
        raise ExportError(f"validated shard lacks column(s) {', '.join(missing)}: re-materialize it with this version")
    rows, refused = rejudged(passed(validated), spec)
    rows, bad_tokens = verify(rows, spec.checks.min_loss_tokens)
    return rows, refused + bad_tokens


def sink(frames: Iterable[pl.DataFrame], schema: Mapping[str, pl.DataType], path: Path) -> None:
    """Write frames, in order, as one parquet file while holding only the frame at hand."""

    def source(with_columns: list[str] | None, *_: object) -> Iterator[pl.DataFrame]:
        for frame in frames:
            yield frame if with_columns is None else frame.select(with_columns)

    register_io_source(source, schema=pl.Schema(schema)).sink_parquet(path, row_group_size=ROW_GROUP_ROWS)


def write_dataset(
    shards: Iterable[pl.DataFrame], spec: DatasetSpec, files: Mapping[str, Path], parquet: Path
) -> Written:
    """One dataset's trainer files (format name -> path, `formats.FORMATS`) and training parquet, shard by
    shard, in shard order."""
    written = Written()

    def training() -> Iterator[pl.DataFrame]:
        with ExitStack() as stack:
            outs = {name: stack.enter_context(path.open("wb")) for name, path in files.items()}
            for validated in shards:
                rows, dropped = exportable(validated, spec)
                for name, out in outs.items():
                    out.write(FORMATS[name].render(rows))
                written.rows += rows.height
                written.tokens += int(rows["input_ids"].list.len().sum() or 0)
                written.dropped.update(dropped)
                yield to_training_parquet(rows)

    sink(training(), TRAINING_SCHEMA, parquet)
    return written


def write_mix_files(mix: Path, files: Mapping[str, Path], chunk_rows: int) -> None:
    """The tokenized formats' files of the whole mix (format name -> path), in mix order, rendered from
    `mix` a chunk at a time."""
    with ExitStack() as stack:
        outs = {name: stack.enter_context(path.open("wb")) for name, path in files.items()}
        for chunk in pl.scan_parquet(mix).collect_batches(chunk_size=chunk_rows):
            for name, out in outs.items():
                out.write(FORMATS[name].render(chunk))


@dataclass(frozen=True)
class _Part:
    """One dataset's rows in the mix before shuffling: `whole` full copies, then the sampled `extra` rows."""

    name: str
    offset: int  # where the part starts in the unshuffled mix
    height: int
    whole: int
    extra: pl.Series  # dataset row numbers of the fractional sample, ascending


@dataclass(frozen=True)
class MixPlan:
    """Where every row of every dataset lands in the mix, as row numbers only."""

    parts: tuple[_Part, ...]
    position: pl.Series  # unshuffled row number -> position in the mix

    @property
    def rows(self) -> int:
        return len(self.position)

    def landing(self, name: str, start: int, stop: int) -> tuple[pl.Series, pl.Series]:
        """For dataset rows [start, stop): (row number within that range, mix position), once per copy."""
        part = next(p for p in self.parts if p.name == name)
        local = [pl.int_range(start, stop, eager=True)] * part.whole
        first, last = part.extra.search_sorted(start), part.extra.search_sorted(stop)
        unshuffled = [part.offset + copy * part.height + rows for copy, rows in enumerate(local)]
        local.append(part.extra.slice(first, last - first))
        unshuffled.append(pl.int_range(first, last, eager=True) + part.offset + part.whole * part.height)
        rows = pl.concat([s.cast(pl.Int64) for s in local]) - start
        return rows, self.position.gather(pl.concat([s.cast(pl.Int64) for s in unshuffled]))


def plan_mix(heights: Mapping[str, int], weights: Mapping[str, float], seed: int) -> MixPlan:
    """The mix of datasets with `heights` rows each: a weight multiplies a dataset's rows (1 keeps each
    row once, 0.5 a random half, 2.5 every row twice plus a random half, 0 none), then all are shuffled.
    The same heights, weights and seed give the same plan; a dataset's sample depends on its own name
    only, so adding a dataset moves no other's rows."""
    if not heights:
        raise ValueError("mix: no datasets given")
    missing = sorted(set(heights) - set(weights))
    if missing:
        raise ValueError(f"mix: no weight for {', '.join(missing)}; give every dataset a weight (0 leaves it out)")
    parts, offset = [], 0
    for name in sorted(heights):
        height, weight = heights[name], weights[name]
        if weight < 0:
            raise ValueError(f"mix: weight for {name} is {weight}; weights must be >= 0")
        whole, fraction = divmod(weight, 1.0)
        rng = random.Random(f"{seed}:{name}")
        extra = sorted(rng.sample(range(height), round(fraction * height)))
        parts.append(_Part(name, offset, height, int(whole), pl.Series(extra, dtype=pl.Int64)))
        offset += int(whole) * height + len(extra)
    order = array.array("q", range(offset))  # 8 bytes a row; shuffle() uses only len and item swaps, so the
    random.Random(seed).shuffle(order)  # permutation is exactly that of shuffling a list of row numbers
    return MixPlan(tuple(parts), pl.Series(np.frombuffer(order, dtype=np.int64)).arg_sort().cast(pl.Int64))


def write_mix(trains: Mapping[str, Path], plan: MixPlan, out: Path, spill: Path, bucket_rows: int) -> int:
    """The mix of the datasets' training parquet files, in `plan`'s order, holding one bucket of
    `bucket_rows` mix positions at a time. Rows are first appended to one spill file under `spill`, each
    piece tagged with the bucket it lands in; then each bucket's pieces are read back, put in order and
    appended to `out`. Returns the rows written, counted on the way out."""
    segments: list[list[tuple[int, int]]] = [[] for _ in range(-(-plan.rows // bucket_rows))]
    spill_file = spill / "mix.arrows"
    with spill_file.open("wb") as pieces:
        for name in sorted(trains):
            start = 0
            for chunk in pl.scan_parquet(trains[name]).collect_batches(chunk_size=bucket_rows):
                rows, position = plan.landing(name, start, start + chunk.height)
                start += chunk.height
                landed = chunk.select(pl.all().gather(rows)).with_columns(
                    _position=position, _bucket=position // bucket_rows
                )
                for (bucket,), part in landed.partition_by("_bucket", as_dict=True, include_key=False).items():
                    offset = pieces.tell()
                    part.write_ipc_stream(pieces, compression="lz4")
                    segments[bucket].append((offset, pieces.tell() - offset))
    written = 0

    def ordered() -> Iterator[pl.DataFrame]:
        nonlocal written
        with spill_file.open("rb") as pieces:
            for bucket in segments:
                parts = []
                for offset, length in bucket:
                    pieces.seek(offset)
                    parts.append(pl.read_ipc_stream(io.BytesIO(pieces.read(length))))
                if parts:
                    rows = pl.concat(parts).sort("_position").drop("_position")
                    written += rows.height
                    yield rows

    sink(ordered(), TRAINING_SCHEMA, out)
    spill_file.unlink()
    if written != plan.rows:
        raise ExportError(f"training mix: wrote {written} rows of the {plan.rows} planned; run the export again")
    return written


def bucket_rows(rows: int, tokens: int) -> int:
    """Mix rows per bucket so that a bucket's token lists stay near BUCKET_BYTES (5 bytes a token)."""
    per_row = 5 * tokens / max(rows, 1) + 64
    return max(1, int(BUCKET_BYTES // per_row))
