"""Per-shard quality records: typed, versioned, written once at validation and read by everything after.

A dataset report over hundreds of shards must not re-read their token ids, and an asset check must not
recompute what validation already found: each validated shard leaves one record of its summary, report
figures and check results, and the roll-up and the asset checks read that. The record is JSON with a
`version`; a record of another version, one that no longer reads as this type, or one whose results
were judged by other check definitions (a gate added, or made blocking) is stale and is rebuilt from its
shard by the caller (report.py), which says so in one line. Fields added later get
defaults, so a record written before them still reads.

The record is the one home of a validated shard's check outcomes and digest: the gates judged at validation,
the checks judged later on the stored shard (`judged_after`: decontamination, on_policy), each with the digest
of the bytes it judged, and the sha256 and size of the shard as stored. The asset checks, the export's admission
(`exports.gate_records`) and the report read it; nothing reads outcomes back from Dagster's event log. A check
judged after validation stores its outcome as its own object beside the record (`layout.judged_outcome`),
never inside it: two such checks run side by side, and a read-modify-write of one shared file lost one of
them. Reading a record joins them in (report.py); the admission's digest comparison decides which still hold.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

import polars as pl
from pydantic import TypeAdapter, ValidationError

from eagle_data.quality.figures import Bins, Figures, figures, tables
from eagle_data.quality.gates import CHECKS, CheckResult, Inputs, evaluate
from eagle_data.quality.summary import Summary, summarize
from eagle_data.quality.verdicts import is_answered

# 1: the untyped dicts written before records were versioned (they carry no `version`).
# 2: typed records with token accounting (lost_text, the accounting ratio) and the inputs judged with.
# 3: the sha256 of the shard bytes judged, which every check evaluation carries to the export's gate.
# 4: the checks judged after validation in their own objects, no longer inside the record.
SCHEMA_VERSION = 4
_TOP_LOSS_KEPT = 20  # most common loss-mask sums kept per shard
_TEXT_KEPT = 200  # characters of the most repeated completion kept


@dataclass(frozen=True)
class Judged:
    """One check's outcome on one stored shard: whether it passed, its one line, the sha256 of the shard bytes
    it judged and the run that judged them."""

    check: str
    passed: bool
    message: str
    shard_sha256: str
    run_id: str = ""


@dataclass(frozen=True)
class ShardRecord:
    """What one verdicted shard left: its counts, figures and check results, and what it was judged with."""

    partition: str
    summary: Summary
    numbers: dict[str, float | int]
    completion_hist: Bins
    loss_hist: Bins
    ratio_hist: Bins
    top_loss: list[tuple[int, int]]  # (loss-mask sum, rows), most common first
    results: list[CheckResult]  # in CHECKS order
    inputs: Inputs
    shard_sha256: str = ""  # of the validated shard's bytes these results judged ("" until it is written)
    version: int = SCHEMA_VERSION
    shard_size: int = 0  # of those bytes (0: recorded before sizes were)
    run_id: str = ""  # the run that validated the shard ("": outside a Dagster run)
    judged_after: tuple[Judged, ...] = ()  # checks judged on the stored shard after validation

    def outcomes(self) -> dict[str, Judged]:
        """Every check's stored outcome on this shard, by name: the gates, judged at validation on the bytes of
        `shard_sha256`, and the checks judged after it, on the bytes each names."""
        gates = {r.name: Judged(r.name, r.passed, r.message, self.shard_sha256, self.run_id) for r in self.results}
        return gates | {judged.check: judged for judged in self.judged_after}

    def current_judged(self) -> tuple[Judged, ...]:
        """The checks judged after validation on the very bytes this record judged (what the shard's page shows)."""
        return tuple(j for j in self.judged_after if self.shard_sha256 and j.shard_sha256 == self.shard_sha256)

    def figures(self) -> Figures:
        """The shard's report figures, as `figures()` gave them at validation."""
        s, top = self.summary, self.top_loss[:5]
        md = tables(self.completion_hist, self.loss_hist, self.ratio_hist, s.verdicts, [], top, s.answered)
        return Figures(self.numbers, md, self.completion_hist, self.loss_hist, [], s.verdicts, self.ratio_hist)

    def to_json(self) -> bytes:
        """The record as stored: without `judged_after`, whose outcomes each live in their own object."""
        return _ADAPTER.dump_json(replace(self, judged_after=()))

    @staticmethod
    def from_json(data: bytes) -> ShardRecord | None:
        """The record, or None when it is stale (another version, no longer this type's shape, or judged by
        other check definitions: a stored result must not keep a gate non-blocking once it blocks)."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("version") != SCHEMA_VERSION:
                return None
            record = _ADAPTER.validate_python(raw)
        except (ValueError, ValidationError):
            return None
        judged_by = [(r.name, r.severity, r.blocking) for r in record.results]
        return record if judged_by == [(d.name, d.severity, d.blocking) for d in CHECKS] else None


_ADAPTER = TypeAdapter(ShardRecord)
JUDGED = TypeAdapter(Judged)  # one check judged after validation, as its own stored object


def judged_rollup(records: Sequence[ShardRecord]) -> list[Judged]:
    """The checks judged after validation, over every shard's record: one outcome per check, failed when it
    failed on a shard or has not judged a shard's current bytes yet, saying on how many."""
    names = sorted({j.check for r in records for j in r.judged_after})
    out = []
    for name in names:
        outcomes = [(r.partition, r.outcomes().get(name), r.shard_sha256) for r in records]
        current = [(p, o) for p, o, sha in outcomes if o is not None and o.shard_sha256 == sha]
        failed = [(p, o) for p, o in current if not o.passed]
        first = f" ({failed[0][0]}: {failed[0][1].message})" if failed else ""
        missing = len(records) - len(current)
        said = [f"{len(failed)} of {len(records)} shards failed{first}"]
        said += [f"{missing} not judged on their current bytes yet"] if missing else []
        out.append(Judged(name, not failed and not missing, "; ".join(said), ""))
    return out


def shard_record(partition: str, frame: pl.DataFrame, inputs: Inputs) -> ShardRecord:
    """Summarize a verdicted shard once, then take its figures and evaluate every check from that."""
    s = summarize(frame, inputs.checks)
    fig = figures(frame, inputs.checks, s)
    top_loss = (
        frame.filter(is_answered())
        .group_by("loss_tokens")
        .len()
        .sort(["len", "loss_tokens"], descending=[True, False])  # ties in a stable order: records are reproducible
    )
    return ShardRecord(
        partition=partition,
        summary=replace(s, top_repeat_text=s.top_repeat_text[:_TEXT_KEPT]),
        numbers=fig.numbers,
        completion_hist=fig.completion_hist,
        loss_hist=fig.loss_hist,
        ratio_hist=fig.ratio_hist,
        top_loss=[(int(v), int(n)) for v, n in top_loss.head(_TOP_LOSS_KEPT).iter_rows()],
        results=evaluate(s, inputs),
        inputs=inputs,
    )
