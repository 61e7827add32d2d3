"""Truncation rate and the max_new_tokens that would have covered the 95th percentile (pure).

Truncated replies only tell us their length is at least max_new_tokens, so when more than 5% are cut
the 95th percentile lies above the cap and is estimated: a log-normal fitted to the median and the
largest quantile not cut (reply lengths are roughly log-normal), never past MAX_REACH times the cap (a
sample cut at the cap says little about lengths far beyond it). Below 5% it is read off the data.

The suggestion is that 95th percentile with HEADROOM, rounded up to an eighth of its power of two (80, 160,
2,560), and never above the cap when the cap already covered 95% of the replies: replies of at most 60 tokens
under max_tokens 96 suggest 80, not a larger round number the data never asked for.
Lengths are kept as a histogram (`ReplyLengths`): a million replies take as much memory as a thousand,
bounded by the number of distinct lengths (at most max_tokens), with the same figures as a sorted list.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

COVER = 0.95
HEADROOM = 1.25  # a quarter more than the 95th percentile: a sample's percentile is itself uncertain
MAX_REACH = 4  # an estimated percentile is at most this many times the cap the sample ran under


@dataclass(frozen=True)
class TruncationReport:
    total: int
    truncated: int
    rate: float
    p95_tokens: int  # observed, or estimated when `estimated`
    estimated: bool
    suggested_max_tokens: int  # p95 with HEADROOM, rounded up; at most the cap when the cap covered 95%
    warning: str  # empty when the rate is within the threshold


@dataclass
class ReplyLengths:
    """Answered replies as a histogram of lengths (tokens -> replies) plus how many were cut."""

    counts: Counter[int] = field(default_factory=Counter)
    truncated: int = 0

    @classmethod
    def of(cls, completion_tokens: Sequence[int], finish_reasons: Sequence[str]) -> ReplyLengths:
        if len(completion_tokens) != len(finish_reasons):
            raise ValueError("completion_tokens and finish_reasons differ in length")
        lengths = cls()
        for tokens, reason in zip(completion_tokens, finish_reasons, strict=True):
            lengths.add(tokens, reason)
        return lengths

    def add(self, completion_tokens: int, finish_reason: str) -> None:
        self.counts[max(int(completion_tokens), 1)] += 1
        self.truncated += finish_reason == "length"

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def quantile(self, q: float) -> int:
        """Nearest-rank quantile, as over the sorted list of every length."""
        total = self.total
        if not total:
            return 0
        rank = min(total - 1, max(0, math.ceil(q * total) - 1))
        seen = 0
        for length in sorted(self.counts):
            seen += self.counts[length]
            if seen > rank:
                return length
        raise AssertionError("unreachable: rank < total")


def truncation_report(lengths: ReplyLengths, *, max_new_tokens: int, threshold: float) -> TruncationReport:
    """Share of replies cut at max_new_tokens (finish_reason "length") and a max_new_tokens covering 95%."""
    total, truncated = lengths.total, lengths.truncated
    rate = truncated / total if total else 0.0
    estimated = rate > 1 - COVER
    p95 = _p95_censored(lengths, rate, max_new_tokens) if estimated else lengths.quantile(COVER)
    suggested = rounded_up(p95 * HEADROOM)
    if not estimated and max_new_tokens > 0:
        suggested = min(suggested, max_new_tokens)
    warning = ""
    if rate > threshold:
        how = "an estimated" if estimated else "the observed"
        warning = (
            f"truncation {rate:.1%} of {total} replies exceeds {threshold:.1%} at "
            f"max_new_tokens={max_new_tokens}; {how} 95th percentile is {p95} tokens: "
            f"set max_tokens to about {suggested}"
        )
    return TruncationReport(total, truncated, rate, p95, estimated, suggested, warning)


def rounded_up(tokens: float) -> int:
    """`tokens` rounded up to a multiple of an eighth of the power of two at or below it (75 -> 80, 2,500 ->
    2,560): a figure people set, at most 12.5% above what was asked."""
    want = max(1, math.ceil(tokens))
    step = 2 ** max(0, want.bit_length() - 4)
    return math.ceil(want / step) * step


def _p95_censored(lengths: ReplyLengths, rate: float, cap: int) -> int:
    """Log-normal 95th percentile from the median and the highest uncut quantile (1 - rate)."""
    if rate >= 0.5:
        return 2 * cap  # the median itself is cut: no fit, only "at least twice as long"
    q_hi = 1 - rate
    median = lengths.quantile(0.5)
    x_hi = max(lengths.quantile(q_hi - 1 / lengths.total), median + 1)
    sigma = (math.log(x_hi) - math.log(median)) / NormalDist().inv_cdf(q_hi)
    fitted = round(math.exp(math.log(median) + sigma * NormalDist().inv_cdf(COVER)))
    return min(MAX_REACH * cap, max(cap + 1, fitted))
