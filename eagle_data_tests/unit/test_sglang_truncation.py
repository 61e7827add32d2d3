"""Truncation rate and the suggested max_new_tokens (pure function)."""

from __future__ import annotations

import math
import random

import pytest

from eagle_data.quality.truncation import ReplyLengths, truncation_report


def censored(lengths: list[int], cap: int) -> tuple[list[int], list[str]]:
    """What an engine reports when replies of these true lengths are cut at `cap`."""
    return [min(n, cap) for n in lengths], ["length" if n >= cap else "stop" for n in lengths]


def lognormal_lengths(n: int, median: float, sigma: float, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [max(1, round(math.exp(math.log(median) + sigma * rng.gauss(0, 1)))) for _ in range(n)]


def test_no_truncation_reads_the_95th_percentile_off_the_data() -> None:
    tokens, reasons = censored(list(range(1, 101)), cap=4096)
    report = truncation_report(ReplyLengths.of(tokens, reasons), max_new_tokens=4096, threshold=0.05)
    assert (report.truncated, report.rate, report.p95_tokens, report.estimated) == (0, 0.0, 95, False)
    assert report.suggested_max_tokens == 120 and report.warning == ""  # 95 with a quarter more, rounded up to 8


@pytest.mark.parametrize(("cap", "estimated"), [(1500, True), (2500, True), (4000, False)])
def test_the_95th_percentile_is_found_above_and_below_the_cap(cap: int, estimated: bool) -> None:
    true = lognormal_lengths(5000, median=1200, sigma=0.6)
    true_p95 = sorted(true)[int(0.95 * len(true)) - 1]
    tokens, reasons = censored(true, cap)
    report = truncation_report(ReplyLengths.of(tokens, reasons), max_new_tokens=cap, threshold=0.05)
    assert report.rate == pytest.approx(sum(n >= cap for n in true) / len(true))
    assert report.estimated is estimated and bool(report.warning) is estimated
    assert report.p95_tokens == pytest.approx(true_p95, rel=0.15)  # exact when not estimated
    assert report.p95_tokens <= report.suggested_max_tokens <= max(cap, 2 * report.p95_tokens)
    if estimated:
        assert f"max_new_tokens={cap}" in report.warning
        assert str(report.suggested_max_tokens) in report.warning


def test_most_replies_cut_suggests_at_least_double() -> None:
    tokens, reasons = censored(lognormal_lengths(400, median=3000, sigma=0.5), cap=1024)
    report = truncation_report(ReplyLengths.of(tokens, reasons), max_new_tokens=1024, threshold=0.05)
    assert report.rate > 0.5 and report.p95_tokens == 2048 and report.warning


def test_rate_within_threshold_gives_no_warning() -> None:
    tokens, reasons = censored([100] * 97 + [5000] * 3, cap=4096)
    report = truncation_report(ReplyLengths.of(tokens, reasons), max_new_tokens=4096, threshold=0.05)
    assert report.rate == 0.03 and report.warning == ""


def test_empty_input_and_mismatched_lengths() -> None:
    assert truncation_report(ReplyLengths.of([], []), max_new_tokens=10, threshold=0.05).rate == 0.0
    with pytest.raises(ValueError):
        ReplyLengths.of([1, 2], ["stop"])


@pytest.mark.parametrize("q", [0.0, 0.05, 0.5, 0.95, 0.999, 1.0])
def test_the_histogram_quantile_equals_the_nearest_rank_of_the_sorted_list(q: float) -> None:
    lengths = lognormal_lengths(3001, median=300, sigma=0.8, seed=3)
    ordered = sorted(lengths)
    nearest_rank = ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
    assert ReplyLengths.of(lengths, ["stop"] * len(lengths)).quantile(q) == nearest_rank
