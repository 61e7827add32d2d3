"""The dataset roll-up, built from per-shard records (records.py) without re-reading any shard.

Histograms add exactly (fixed bin edges); shares are recomputed from summed counts; the "one value
dominates" figures (top loss-mask sum, repeated completion) cannot be added, so the roll-up reports the
worst shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from eagle_data.quality.figures import Bins, Figures, shard_row, tables
from eagle_data.quality.gates import CheckResult, combine
from eagle_data.quality.records import ShardRecord
from eagle_data.quality.summary import share

_SUMMED = (
    "rows", "requested", "failed", "answered", "truncated", "completed", "short", "missing_reasoning",
    "ids_checked", "ids_mismatch", "train_rows", "lost_text", "accounted", "engine_tokens", "reply_tokens",
)  # fmt: skip


def _add_bins(bins: Sequence[Bins]) -> Bins:
    labels = [label for label, _ in bins[0]]
    return [(label, sum(b[i][1] for b in bins)) for i, label in enumerate(labels)]


def _numbers(records: Sequence[ShardRecord]) -> dict[str, float | int]:
    summaries = [r.summary for r in records]
    total = {k: sum(getattr(s, k) for s in summaries) for k in _SUMMED}
    passed = sum(s.verdicts.get("pass", 0) for s in summaries)
    weighted = [(s.avg_completion_tokens, s.answered) for s in summaries if s.avg_completion_tokens is not None]
    numbers: dict[str, float | int] = {
        "shards": len(records),
        "rows": total["rows"],
        "train_rows": total["train_rows"],
        "rejected_rows": total["rows"] - total["train_rows"],
        "pass_share": share(passed, total["rows"]),
        "truncated_share": share(total["truncated"], total["answered"]),
        "failed_share": share(total["failed"], total["requested"]),
        "short_share": share(total["short"], total["answered"]),
        "missing_reasoning_share": share(total["missing_reasoning"], total["completed"]),
        "ids_mismatch_share": share(total["ids_mismatch"], total["ids_checked"]),
        "lost_text_share": share(total["lost_text"], total["answered"]),
        "top_loss_share_worst_shard": max(r.numbers["top_loss_share"] for r in records),
        "repeat_share_worst_shard": max(r.numbers["repeat_share"] for r in records),
        "loss_tokens_total": sum(r.numbers["loss_tokens_total"] for r in records),
    }
    if total["accounted"]:
        numbers["token_ratio"] = share(total["reply_tokens"], total["engine_tokens"])
    if weighted:
        answered = sum(n for _, n in weighted)
        numbers["avg_completion_tokens"] = sum(avg * n for avg, n in weighted) / answered
        numbers["max_completion_tokens"] = max(r.numbers.get("max_completion_tokens", 0) for r in records)
    return numbers


def rollup(records: Sequence[ShardRecord]) -> tuple[Figures, list[CheckResult]]:
    """Dataset figures and check results from shard records (any order; one record per shard)."""
    if not records:
        raise ValueError("no shard records to roll up: materialize a validated shard first")
    records = sorted(records, key=lambda r: r.partition)
    verdicts: Counter[str] = Counter()
    top_loss: Counter[int] = Counter()
    for r in records:
        verdicts.update(r.summary.verdicts)
        top_loss.update(dict(r.top_loss))
    shards = [shard_row(r.partition, r.summary) for r in records]
    completion_hist = _add_bins([r.completion_hist for r in records])
    loss_hist = _add_bins([r.loss_hist for r in records])
    ratio_hist = _add_bins([r.ratio_hist for r in records])
    replies = sum(r.summary.answered for r in records)
    md = tables(completion_hist, loss_hist, ratio_hist, dict(verdicts), shards, top_loss.most_common(5), replies)
    numbers = _numbers(records)
    fig = Figures(numbers, md, completion_hist, loss_hist, shards, dict(sorted(verdicts.items())), ratio_hist)
    return fig, combine({r.partition: r.results for r in records})
