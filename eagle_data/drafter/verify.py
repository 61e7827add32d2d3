"""Verify captured hidden states, read back from storage: the `hidden_states` asset's blocking checks.

Every stored sample of every format is read: its ids and mask must equal its mix row, its values be
finite, its shape be [row length, layers, hidden size of the target]. A seeded sample of rows is captured
again, each alone, and must match what was stored within `TOLERANCE` of the sample's largest value (plus
fp8's bound where the native format stores fp8). The bytes on disk must be within 2% of the plan's
formula (`hidden_states.capture_bytes`) for the same layers, dtype, format, samples and tokens.

Each shard is judged on its own (`Findings` of one shard), so a corrupt shard fails only its own verdicts,
and each verdict carries the sha256 of the stored bytes it read. Every file read is hashed as it is read: the
first verification after a capture records each file's digest (`Findings.files`), and every later one (the next
capture run that skips the shard, a checks-only run) checks the files against them: a file changed since
(values rescaled, rows rewritten) fails `ids_match_mix` (the stored samples are no longer those made from the mix
and verified) with the line naming it, what changed and the command that captures the shard again, whatever the
sampled re-capture would have caught.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from eagle_data.drafter import formats, trainers
from eagle_data.drafter.capture import CaptureBackend
from eagle_data.drafter.hidden_states import capture_bytes
from eagle_data.drafter.layers import LayerPlan
from eagle_data.drafter.settings import HiddenStateRecipe
from eagle_data.quality import registry
from eagle_data.storage import ShardStore
from eagle_data.storage.digests import ChangedFile, FileDigest, check

IDS, FINITE, SHAPES, RECAPTURE, BYTES = (
    "ids_match_mix", "finite", "shapes_match_target", "recapture_matches", "bytes_match_plan"
)  # fmt: skip
# Declared (descriptions, severity, blocking) in quality.registry; name -> description
CHECKS = {c.name: c.description for c in registry.implemented("capture", (IDS, FINITE, SHAPES, RECAPTURE, BYTES))}
TOLERANCE = {"fp32": 1e-4, "bf16": 2.0**-6}  # of the sample's largest |value|: batching changes the sums' order
BYTES_TOLERANCE = 0.02
SHOWN = 5  # sample names quoted in a failing check's line


@dataclass
class Findings:
    """What verification found in one capture shard."""

    partition: str
    samples: int = 0
    problems: dict[str, list[str]] = field(default_factory=lambda: {name: [] for name in CHECKS})
    recaptured: int = 0
    recapture_worst: float = 0.0  # the largest error as a share of the allowed error (<= 1 passes)
    actual_bytes: dict[str, int] = field(default_factory=dict)
    planned_bytes: dict[str, int] = field(default_factory=dict)
    absent: str = ""  # why there was nothing to verify (no record of the current capture): every check fails
    files: dict[str, FileDigest] = field(default_factory=dict)  # every stored file read, by key
    changed: list[ChangedFile] = field(default_factory=list)  # files unlike their recorded digests

    def took(self, uri: str, key: str, data: bytes, recorded: dict[str, FileDigest] | None, repair: str) -> None:
        """Hash one stored file as read; with `recorded` digests, note it when it is not the file recorded."""
        self.files[key] = found = FileDigest.of(data)
        if recorded is None:
            return
        try:
            check(uri, found, recorded.get(key, FileDigest("(none: not among the files recorded)", 0)), repair)
        except ChangedFile as exc:
            self.changed.append(exc)

    @property
    def shard_sha256(self) -> str:
        """The sha256 of the stored bytes these findings judged: over each file's key and digest, in read order
        (every byte hashed once, as read)."""
        listed = "".join(f"{key}\0{d.sha256}\0{d.size}\n" for key, d in self.files.items())
        return hashlib.sha256(listed.encode()).hexdigest()

    def bytes_error(self) -> float:
        planned, actual = sum(self.planned_bytes.values()), sum(self.actual_bytes.values())
        return abs(actual - planned) / planned if planned else 0.0

    def passed(self, name: str) -> bool:
        if self.absent or (name == IDS and self.changed):
            return False
        if name == BYTES:
            return self.bytes_error() <= BYTES_TOLERANCE and not self.problems[BYTES]
        return not self.problems[name]

    def data_ok(self) -> bool:
        """Whether the stored samples themselves passed (every check but the plan's formula)."""
        return all(self.passed(name) for name in CHECKS if name != BYTES)

    def line(self, name: str) -> str:
        """The check's one line for this shard: what failed and what to do, or what passed."""
        shard, redo = f"shard {self.partition}: ", f"re-materialize hidden_states partition {self.partition}"
        if self.absent:
            return f"{shard}{self.absent}: materialize hidden_states partition {self.partition}"
        found = self.problems[name]
        if name == IDS and self.changed and not found:
            more = f" (and {len(self.changed) - 1} more file(s))" if len(self.changed) > 1 else ""
            return f"{shard}{self.changed[0]}{more}"
        first = f" (first: {', '.join(found[:SHOWN])})" if found else ""
        if name == BYTES:
            shown = f"{sum(self.actual_bytes.values()):,} bytes on disk vs {sum(self.planned_bytes.values()):,} planned"
            if self.passed(name):
                return f"{shard}{shown} ({self.bytes_error():.2%} apart)"
            fix = "fix the plan's formula (formats.SAMPLE_BYTES)"
            return f"{shard}{shown} ({self.bytes_error():.2%} apart){first}: {fix} or {redo}"
        if not found:
            done = f"{self.recaptured} rows re-captured, worst {self.recapture_worst:.0%} of the tolerance"
            return shard + (done if name == RECAPTURE else f"{self.samples} stored samples verified")
        what = {
            IDS: "stored sample(s) missing, unreadable or unlike their mix row",
            FINITE: "stored sample(s) hold NaN or infinite values",
            SHAPES: "stored sample(s) have the wrong shape for the target",
            RECAPTURE: "re-captured row(s) differ from what was stored beyond the tolerance",
        }[name]
        return f"{shard}{len(found)} {what}{first}: {redo}"

    def metadata(self) -> dict[str, Any]:
        return {
            "samples_verified": self.samples,
            "rows_recaptured": self.recaptured,
            "recapture_worst_share_of_tolerance": round(self.recapture_worst, 4),
            "bytes_on_disk": sum(self.actual_bytes.values()),
            "bytes_planned": sum(self.planned_bytes.values()),
            "bytes_error": round(self.bytes_error(), 5),
            "files_changed": len(self.changed),
        }


@dataclass(frozen=True)
class Recorded:
    """The digests a shard's files were recorded with (None: none yet, this verification records them) and the
    command that captures the shard again."""

    files: dict[str, FileDigest] | None
    repair: str


def _stored(
    store: ShardStore,
    folder: str,
    partition: str,
    fmt: str,
    rows: list[int],
    plan: LayerPlan,
    found: Findings,
    recorded: Recorded,
) -> Iterator[formats.Stored]:
    """Every stored sample of one target for the shard's captured rows; missing and unreadable files are
    recorded, and their bytes counted and hashed (checked against `recorded`)."""
    size = 0

    def read(key: str) -> bytes | None:
        nonlocal size
        if not store.exists(key):
            found.problems[IDS].append(f"{fmt} {key} missing")
            return None
        data = store.read_bytes(key)
        size += len(data)
        found.took(store.uri(key), key, data, recorded.files, recorded.repair)
        return data

    trainer = trainers.REGISTRY[fmt]
    try:
        if trainer.container == trainers.NATIVE_FILES:
            yield from _stored_native(read, folder, partition, rows, found)
            return
        masks = _dataset_masks(read, folder, fmt, partition, rows, found) if trainer.dataset else {}
        for index, row in enumerate(rows):
            data = read(formats.row_key(folder, fmt, partition, row, index))
            if data is None:
                continue
            try:
                sample = formats.read_row(data, trainer, row, plan)
            except Exception as exc:  # a truncated or foreign file: unreadable, whatever the parser raised
                found.problems[IDS].append(f"{fmt} row {row} unreadable ({type(exc).__name__})")
                continue
            if trainer.dataset:
                ids, mask = masks.get(row, (None, None))
                if ids is None or not np.array_equal(ids, sample.input_ids):
                    found.problems[IDS].append(f"{fmt} dataset row {index} unlike hs_{index}")
                sample = dataclasses.replace(sample, loss_mask=mask)
            yield sample
    finally:
        found.actual_bytes[fmt] = found.actual_bytes.get(fmt, 0) + size


def _stored_native(
    read: Callable[[str], bytes | None], folder: str, partition: str, rows: list[int], found: Findings
) -> Iterator[formats.Stored]:
    raw = read(formats.native_index_key(folder, partition))
    index = json.loads(raw) if raw is not None else {"files": []}
    indexed = [int(e[0]) for f in index["files"] for e in f["rows"]]
    if sorted(indexed) != sorted(rows):
        found.problems[IDS].append(f"native index of {partition} lists other rows than were captured")
    for batch, entry in enumerate(index["files"]):
        data = read(formats.native_key(folder, partition, batch))
        try:
            yield from formats.read_native(data, entry["rows"]) if data is not None else ()
        except Exception as exc:  # any parse failure of a stored file is the same finding
            found.problems[IDS].append(f"native {entry['file']} unreadable ({type(exc).__name__})")


def _dataset_masks(
    read: Callable[[str], bytes | None], folder: str, fmt: str, partition: str, rows: list[int], found: Findings
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each row's (ids, mask) in the shard's Arrow dataset, which must list the captured rows in mix order."""
    keys = [formats.dataset_key(folder, fmt, partition, f) for f in formats.DATASET_FILES]
    data, *_ = (read(key) for key in keys)
    try:
        table = formats.read_dataset(data) if data is not None else None
    except Exception as exc:  # a truncated or foreign file
        found.problems[IDS].append(f"{fmt} dataset of {partition} unreadable ({type(exc).__name__})")
        return {}
    if table is None or table["row"].to_list() != rows:
        found.problems[IDS].append(f"{fmt} dataset of {partition} lists other rows than were captured")
        return {}
    return {
        row: (np.asarray(ids), np.asarray(mask))
        for row, ids, mask in table.select("row", "input_ids", "loss_mask").iter_rows()
    }


def verify_shard(
    store: ShardStore,
    folder: str,
    record: dict[str, Any],
    frame: pl.DataFrame,
    plan: LayerPlan,
    backend: CaptureBackend,
    recapture_rows: int,
    seed: int,
    recorded: Recorded | None = None,
) -> Findings:
    """Check one captured shard (its record from capture_shard) against `recorded`, its mix rows and the target."""
    import torch

    partition, found = record["partition"], Findings(record["partition"])
    mix = {
        row: (np.asarray(ids), np.asarray(mask))
        for row, ids, mask in frame.select("row", "input_ids", "loss_mask").iter_rows()
    }
    rows = sorted(int(r[0]) for batch in record["batches"] for r in batch)
    picked = set(random.Random(f"{seed}-{partition}").sample(rows, min(recapture_rows, len(rows))))
    kept: dict[int, list[formats.Stored]] = {row: [] for row in picked}
    tokens = sum(len(mix[row][0]) for row in rows)
    for fmt in record["formats"]:
        dtype = "fp8" if fmt == formats.NATIVE and record["fp8"] else record["dtype"]
        layers = formats.stored_layers(trainers.REGISTRY[fmt], plan)
        recipe = HiddenStateRecipe(captured_layers=layers, hidden_size=backend.hidden_size, dtype=dtype, format=fmt)
        found.planned_bytes[fmt] = capture_bytes(recipe, len(rows), tokens)
        for sample in _stored(store, folder, partition, fmt, rows, plan, found, recorded or Recorded(None, "")):
            found.samples += 1
            name = f"{fmt} row {sample.row}"
            ids, mask = mix.get(sample.row, (None, None))
            if (
                ids is None
                or not np.array_equal(sample.input_ids, ids)
                or (sample.loss_mask is not None and not np.array_equal(sample.loss_mask, mask))
            ):
                found.problems[IDS].append(name)
            if not bool(torch.isfinite(sample.states).all()):
                found.problems[FINITE].append(name)
            if tuple(sample.states.shape) != (len(ids) if ids is not None else -1, layers, backend.hidden_size):
                found.problems[SHAPES].append(f"{name} {tuple(sample.states.shape)}")
            if sample.row in kept:
                kept[sample.row].append(sample)
    for row, samples in sorted(kept.items()):
        fresh = backend.capture([mix[row][0].astype(np.int64)], plan)[0].float()
        found.recaptured += 1
        scale = fresh.abs().max().item() or 1.0
        for sample in samples:
            wanted = fresh[:, : sample.states.shape[1]]  # a DFlash file may leave out the last state
            allowed = TOLERANCE[record["dtype"]] * scale
            if sample.scales is not None:
                allowed = allowed + formats.fp8_bound(wanted, sample.scales)
            if sample.states.shape != wanted.shape:
                continue  # counted by the shape check
            share = float(((sample.states - wanted).abs() / allowed).max()) if wanted.numel() else 0.0
            found.recapture_worst = max(found.recapture_worst, share)
            if not share <= 1.0:  # NaN fails too
                found.problems[RECAPTURE].append(f"row {row} ({share:.1f}x the tolerance)")
    return found
