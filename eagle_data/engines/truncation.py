"""Truncation rate and the max_new_tokens that would have covered the 95th percentile (pure).

Truncated replies only tell us their length is at least max_new_tokens, so when more than 5% are cut
the 95th percentile lies above the cap and is estimated: a log-normal fitted to the median and the
largest quantile not cut (reply lengths are roughly log-normal). Below 5% it is read off the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

COVER = 0.95
ROUND_TO = 256


@dataclass(frozen=True)
class TruncationReport:
    total: int
    truncated: int
    rate: float
    p95_tokens: int  # observed, or estimated when `estimated`
    estimated: bool
    suggested_max_tokens: int  # p95 rounded up to a multiple of 256
    warning: str  # empty when the rate is within the threshold


def truncation_report(
    completion_tokens: Sequence[int], finish_reasons: Sequence[str], *, max_new_tokens: int, threshold: float
) -> TruncationReport:
    """Share of replies cut at max_new_tokens (finish_reason "length") and a max_new_tokens covering 95%."""
    if len(completion_tokens) != len(finish_reasons):
        raise ValueError("completion_tokens and finish_reasons differ in length")
    total = len(completion_tokens)
    cut = [r == "length" for r in finish_reasons]
    truncated = sum(cut)
    rate = truncated / total if total else 0.0
    lengths = sorted(max(int(n), 1) for n in completion_tokens)
    estimated = rate > 1 - COVER
    p95 = _p95_censored(lengths, rate, max_new_tokens) if estimated else _quantile(lengths, COVER)
    suggested = max(ROUND_TO, math.ceil(p95 / ROUND_TO) * ROUND_TO)
    warning = ""
    if rate > threshold:
        how = "an estimated" if estimated else "the observed"
        warning = (
            f"truncation {rate:.1%} of {total} replies exceeds {threshold:.1%} at "
            f"max_new_tokens={max_new_tokens}; {how} 95th percentile is {p95} tokens: "
            f"set max_tokens to about {suggested}"
        )
    return TruncationReport(total, truncated, rate, p95, estimated, suggested, warning)


def _quantile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank quantile."""
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def _p95_censored(lengths: list[int], rate: float, cap: int) -> int:
    """Log-normal 95th percentile from the median and the highest uncut quantile (1 - rate)."""
    if rate >= 0.5:
        return 2 * cap  # the median itself is cut: no fit, only "at least twice as long"
    q_hi = 1 - rate
    median = _quantile(lengths, 0.5)
    x_hi = max(_quantile(lengths, q_hi - 1 / len(lengths)), median + 1)
    sigma = (math.log(x_hi) - math.log(median)) / NormalDist().inv_cdf(q_hi)
    return max(cap + 1, round(math.exp(math.log(median) + sigma * NormalDist().inv_cdf(COVER))))
