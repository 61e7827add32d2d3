"""Per-shard quality records (small JSON-able dicts) and the dataset roll-up built from them.

A dataset report over hundreds of shards must not re-read their token ids: each validated shard leaves
a record of its counts, histogram bins and check results, and the roll-up adds those up. Histograms
add exactly (fixed bin edges); shares are recomputed from summed counts; the "one value dominates"
figures (top loss-mask sum, repeated completion) cannot be added, so the roll-up reports the worst shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import polars as pl

from eagle_data.catalog import Checks
from eagle_data.quality.figures import Figures, figures, shard_row, tables
from eagle_data.quality.gates import CHECKS, CheckResult, combine
from eagle_data.quality.summary import Summary, share, summarize
from eagle_data.quality.verdicts import is_answered

Record = dict[str, Any]
_TOP_LOSS_KEPT = 20  # most common loss-mask sums kept per shard
_SUMMED = (
    "rows", "requested", "failed", "answered", "truncated", "completed", "short", "missing_reasoning",
    "ids_checked", "ids_mismatch",
)  # fmt: skip


def shard_record(partition: str, frame: pl.DataFrame, checks: Checks, results: Sequence[CheckResult]) -> Record:
    """What the roll-up needs of one verdicted shard."""
    s = summarize(frame, checks)
    fig = figures(frame, checks)
    top_loss = (
        frame.filter(is_answered())
        .group_by("loss_tokens")
        .len()
        .sort(["len", "loss_tokens"], descending=[True, False])  # ties in a stable order: records are reproducible
    )
    return {
        "partition": partition,
        "summary": asdict(replace(s, top_repeat_text=s.top_repeat_text[:200])),
        "numbers": fig.numbers,
        "completion_hist": fig.completion_hist,
        "loss_hist": fig.loss_hist,
        "top_loss": top_loss.head(_TOP_LOSS_KEPT).rows(),
        "results": [asdict(r) for r in results],
    }


def _add_bins(records: Sequence[Record], name: str) -> list[tuple[str, int]]:
    bins = [list(b) for b in records[0][name]]
    for record in records[1:]:
        for i, (_, n) in enumerate(record[name]):
            bins[i][1] += n
    return [(label, n) for label, n in bins]


def _numbers(records: Sequence[Record], summaries: Sequence[Summary]) -> dict[str, float | int]:
    total = {k: sum(getattr(s, k) for s in summaries) for k in _SUMMED}
    train = sum(s.train_rows for s in summaries)
    passed = sum(s.verdicts.get("pass", 0) for s in summaries)
    weighted = [(s.avg_completion_tokens, s.answered) for s in summaries if s.avg_completion_tokens is not None]
    numbers: dict[str, float | int] = {
        "shards": len(records),
        "rows": total["rows"],
        "train_rows": train,
        "rejected_rows": total["rows"] - train,
        "pass_share": share(passed, total["rows"]),
        "truncated_share": share(total["truncated"], total["answered"]),
        "failed_share": share(total["failed"], total["requested"]),
        "short_share": share(total["short"], total["completed"]),
        "missing_reasoning_share": share(total["missing_reasoning"], total["completed"]),
        "ids_mismatch_share": share(total["ids_mismatch"], total["ids_checked"]),
        "top_loss_share_worst_shard": max(r["numbers"]["top_loss_share"] for r in records),
        "repeat_share_worst_shard": max(r["numbers"]["repeat_share"] for r in records),
        "loss_tokens_total": sum(r["numbers"]["loss_tokens_total"] for r in records),
    }
    if weighted:
        answered = sum(n for _, n in weighted)
        numbers["avg_completion_tokens"] = sum(avg * n for avg, n in weighted) / answered
        numbers["max_completion_tokens"] = max(r["numbers"].get("max_completion_tokens", 0) for r in records)
    return numbers


def rollup(records: Sequence[Record]) -> tuple[Figures, list[CheckResult]]:
    """Dataset figures and check results from shard records (any order; one record per shard)."""
    if not records:
        raise ValueError("no shard records to roll up: materialize a validated shard first")
    records = sorted(records, key=lambda r: r["partition"])
    summaries = [Summary(**r["summary"]) for r in records]
    verdicts: Counter[str] = Counter()
    top_loss: Counter[int] = Counter()
    for s, r in zip(summaries, records, strict=True):
        verdicts.update(s.verdicts)
        top_loss.update({value: n for value, n in r["top_loss"]})
    shards = [shard_row(r["partition"], s) for r, s in zip(records, summaries, strict=True)]
    completion_hist, loss_hist = _add_bins(records, "completion_hist"), _add_bins(records, "loss_hist")
    replies = sum(s.answered for s in summaries)
    md = tables(completion_hist, loss_hist, dict(verdicts), shards, top_loss.most_common(5), replies)
    fig = Figures(_numbers(records, summaries), md, completion_hist, loss_hist, shards, dict(sorted(verdicts.items())))
    return fig, _results(records)


def _results(records: Sequence[Record]) -> list[CheckResult]:
    names = [d.name for d in CHECKS if all(any(x["name"] == d.name for x in r["results"]) for r in records)]
    return combine(
        {
            r["partition"]: [CheckResult(**next(x for x in r["results"] if x["name"] == n)) for n in names]
            for r in records
        }
    )
