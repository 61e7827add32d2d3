"""The dataset roll-up, built from per-shard records (records.py) without re-reading any shard.

Histograms add exactly (fixed bin edges); shares are recomputed from summed counts; the "one value
dominates" figures (top loss-mask sum, repeated completion) cannot be added, so the roll-up reports the
worst shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from eagle_data.quality import sampled
from eagle_data.quality.figures import Bins, Figures, count_numbers, on_policy_rolled, shard_row, tables
from eagle_data.quality.gates import CheckResult, combine
from eagle_data.quality.records import ShardRecord
from eagle_data.quality.summary import Summary

# Figures of one value dominating a shard: they do not add up (the roll-up reports the worst shard instead).
_PER_SHARD = ("top_loss_share", "repeat_share")


def _add_bins(bins: Sequence[Bins]) -> Bins:
    labels = [label for label, _ in bins[0]]
    return [(label, sum(b[i][1] for b in bins)) for i, label in enumerate(labels)]


def _total(summaries: Sequence[Summary]) -> Summary:
    """The summed counts of several shards: every Summary field not named here is a count and adds up.
    What does not add up (the dominant value, the repeated text, a bad row's id) is left empty, and the
    average completion length is weighted by answered rows."""
    verdicts: Counter[str] = Counter()
    structure: Counter[str] = Counter()
    for s in summaries:
        verdicts.update(s.verdicts)
        structure.update(s.structure)
    weighted = [(s.avg_completion_tokens, s.answered) for s in summaries if s.avg_completion_tokens is not None]
    answered = sum(n for _, n in weighted)
    not_summed: dict[str, Any] = {
        "top_loss_value": None,
        "top_loss_rows": 0,
        "prompts": 0,
        "top_repeat_text": "",
        "top_repeat_prompts": 0,
        "structure": dict(structure),
        "first_bad_prompt": "",
        "avg_completion_tokens": sum(avg * n for avg, n in weighted) / answered if weighted else None,
        "verdicts": dict(verdicts),
    }
    summed = {f.name: sum(getattr(s, f.name) for s in summaries) for f in fields(Summary) if f.name not in not_summed}
    return Summary(**summed, **not_summed)


def _numbers(records: Sequence[ShardRecord]) -> dict[str, float | int]:
    counted = {k: v for k, v in count_numbers(_total([r.summary for r in records])).items() if k not in _PER_SHARD}
    numbers: dict[str, float | int] = {
        "shards": len(records),
        **counted,
        "top_loss_share_worst_shard": max(r.numbers["top_loss_share"] for r in records),
        "repeat_share_worst_shard": max(r.numbers["repeat_share"] for r in records),
        "loss_tokens_total": sum(r.numbers["loss_tokens_total"] for r in records),
        **on_policy_rolled([r.numbers for r in records]),
        **sampled.rolled([r.numbers for r in records]),
    }
    if "avg_completion_tokens" in numbers:
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
