"""Dataset-level checks: each one shown to fail and to pass, plus the two acceptance fixtures."""

from __future__ import annotations

import polars as pl
import pytest

from eagle_data.catalog import Checks
from eagle_data.quality import CHECKS, CheckResult, Inputs, combine, row_verdicts, run_checks
from eagle_data_tests.fixtures_quality import clean_frame, regression_frame, set_rows, validated_frame, varied_replies

THRESHOLDS = Checks()


@pytest.fixture(scope="module")
def clean() -> pl.DataFrame:
    return clean_frame()


def check(frame: pl.DataFrame, name: str, thinking: bool = True, previous: float | None = None) -> CheckResult:
    results = {r.name: r for r in run_checks(frame, Inputs(THRESHOLDS, thinking, previous))}
    return results[name]


def test_specs_declare_what_the_issue_asks() -> None:
    spec = {d.name: (d.severity, d.blocking) for d in CHECKS}
    asked = {
        "empty_response": ("ERROR", True),
        "token_structure": ("ERROR", True),
        "lost_text": ("ERROR", True),
        "truncation_rate": ("WARN", False),
        "failed_rate": ("ERROR", True),
        "reasoning_present": ("ERROR", False),
        "length_shift": ("WARN", False),
        "loops": ("ERROR", True),
    }
    assert {name: spec[name] for name in asked} == asked  # a gate added later declares its own


def test_clean_fixture_passes_every_check(clean: pl.DataFrame) -> None:
    avg = float(clean.filter(pl.col("status") != "failed")["completion_tokens"].mean())  # type: ignore[arg-type]
    results = run_checks(clean, Inputs(THRESHOLDS, True, avg * 1.2))
    assert [r.name for r in results if not r.passed] == []
    assert len(results) == len(CHECKS)


def test_regression_fixture_fails_the_blocking_check_with_the_87_percent_figure() -> None:
    results = run_checks(regression_frame(), Inputs(THRESHOLDS, True))
    failed = [r for r in results if not r.passed]
    assert [r.name for r in failed] == ["empty_response"]  # one cause, one alert
    r = failed[0]
    assert (r.severity, r.blocking, r.alerts) == ("ERROR", True, True)
    assert r.figure == pytest.approx(0.87)
    assert r.message == (  # the "OK." rows are set aside as short_loss: counted once, not again as one loss-mask sum
        "87.0% of 200 replies were empty or had loss-mask sum <= 16 (limit 1%; at least 77.9% at 99.9% confidence: "
        "over it)"
    )
    assert r.metadata()["figure"] == pytest.approx(0.87)


def test_empty_response_fails_on_short_rows_alone(clean: pl.DataFrame) -> None:
    r = check(set_rows(clean, list(range(20, 28)), loss_tokens=10), "empty_response")
    assert not r.passed
    assert r.message == (
        "4.0% of 199 replies were empty or had loss-mask sum <= 16 (limit 1%; at least 1.4% at 99.9% confidence: "
        "over it)"
    )
    unsure = check(set_rows(clean, [20, 21, 22, 23], loss_tokens=10), "empty_response")  # 2.0%, bound 0.5%
    assert unsure.passed and unsure.message.startswith(
        "2.0% of 199 replies were empty or had loss-mask sum <= 16 (limit 1%; at least 0.5% at 99.9% confidence: "
        "not surely over it)"
    )
    assert check(set_rows(clean, [20], loss_tokens=10), "empty_response").passed  # 0.5%: under the limit


def test_two_rows_sharing_a_value_in_a_small_shard_are_chance(clean: pl.DataFrame) -> None:
    small = clean.head(6)
    assert check(set_rows(small, [0, 1], loss_tokens=321, content="Same."), "empty_response").passed  # 2 of 6
    r = check(set_rows(small, [0, 1, 2], loss_tokens=321), "empty_response")  # 3 of 5 completed: not sure either
    assert r.passed and "60.0% of 5 complete replies have loss-mask sum 321 (limit 20%; at least 13.2%" in r.message
    big = check(set_rows(clean, list(range(0, 200, 3)), loss_tokens=321), "empty_response")  # 33% of 197: sure
    assert not big.passed and big.message.startswith("33.5% of 197 complete replies have loss-mask sum 321")


def test_empty_response_fails_on_one_dominant_loss_sum_alone(clean: pl.DataFrame) -> None:
    r = check(set_rows(clean, list(range(20, 90)), loss_tokens=321), "empty_response")
    assert not r.passed
    assert r.message == (
        "35.5% of 197 complete replies have loss-mask sum 321 (limit 20%; at least 25.9% at 99.9% confidence: over it)"
    )
    assert check(set_rows(clean, list(range(20, 50)), loss_tokens=321), "empty_response").passed  # 15.7%


def test_empty_response_fails_on_one_repeated_completion_alone(clean: pl.DataFrame) -> None:
    r = check(set_rows(clean, list(range(20, 45)), content="I cannot help with that."), "empty_response")
    assert not r.passed
    assert r.message == (
        "12.7% of prompts got the same completion 'I cannot help with that.' (limit 5%; at least 7.1% at 99.9% "
        "confidence: over it)"
    )
    assert check(set_rows(clean, list(range(20, 28)), content="Same."), "empty_response").passed  # 4.1%


def test_a_completion_answering_one_prompt_is_not_a_repeat() -> None:
    r = check(validated_frame(varied_replies(10)), "empty_response")  # 10 distinct replies, none repeated
    assert r.passed and r.details["top_repeat_share"] == 0.0


def test_token_structure_fails_on_a_single_bad_row(clean: pl.DataFrame) -> None:
    r = check(set_rows(clean, [5], eot_ok=False), "token_structure")
    assert not r.passed and r.blocking
    assert r.figure == 1
    assert r.message == "1 of 200 rows have broken token structure (missing_eot 1; e.g. prompt_id fixture-00005)"
    assert check(clean, "token_structure").passed


def test_a_special_token_string_in_a_prompt_is_set_aside_without_blocking(clean: pl.DataFrame) -> None:
    frame = set_rows(clean, [5], special_in_text=1)  # "what does `<|im_end|>` mean?", encoded as text
    assert check(frame, "token_structure").passed
    assert row_verdicts(frame, THRESHOLDS, True)["verdict"][5] == "special_token_in_text"


def test_truncation_rate_warns_above_the_limit(clean: pl.DataFrame) -> None:
    r = check(set_rows(clean, list(range(20, 45)), status="truncated"), "truncation_rate")
    assert (r.passed, r.severity, r.blocking, r.alerts) == (False, "WARN", False, False)
    assert r.message == "13.6% of 199 replies hit max_tokens (limit 5%; at least 7.7% at 99.9% confidence: over it)"
    assert check(clean, "truncation_rate").passed


def test_failed_rate_blocks_above_the_limit_and_says_what_to_do(clean: pl.DataFrame) -> None:
    r = check(set_rows(clean, list(range(20, 32)), status="failed"), "failed_rate")
    assert (r.passed, r.severity, r.blocking, r.alerts) == (False, "ERROR", True, True)
    assert r.message == (
        "6.5% of 200 requests failed (limit 2%; at least 2.9% at 99.9% confidence: over it); re-materialize the "
        "shard's generation: failed rows are requested again, answered ones reused"
    )
    assert check(clean, "failed_rate").passed


def test_a_shard_where_most_requests_failed_fails_a_blocking_check(clean: pl.DataFrame) -> None:
    """499 failed rows and 1 good one used to pass every blocking gate: the others judge answered rows only."""
    mostly_failed = set_rows(clean, list(range(1, clean.height)), status="failed")  # row 0 is a good reply
    results = run_checks(mostly_failed, Inputs(THRESHOLDS, True))
    assert [r.name for r in results if r.blocking and not r.passed] == ["failed_rate"]
    assert next(r for r in results if r.name == "failed_rate").figure == pytest.approx(199 / 200)


def test_failed_rate_ignores_rows_never_sent_for_budget(clean: pl.DataFrame) -> None:
    r = check(set_rows(clean, list(range(100, 200)), status="skipped_budget"), "failed_rate")
    assert r.message == "1.0% of 100 requests failed (limit 2%)"


def test_missing_reasoning_is_an_error_only_when_thinking_is_on(clean: pl.DataFrame) -> None:
    frame = set_rows(clean, list(range(20, 30)), reasoning="")
    r = check(frame, "reasoning_present")
    assert (r.passed, r.severity, r.blocking, r.alerts) == (False, "ERROR", False, True)
    assert r.message == (
        "5.1% of 197 completed rows have no reasoning while thinking is on (limit 1%; at least 2.0% at 99.9% "
        "confidence: over it)"
    )
    assert check(frame, "reasoning_present", thinking=False).passed
    assert check(clean, "reasoning_present").passed


def test_length_shift_warns_with_both_figures(clean: pl.DataFrame) -> None:
    avg = check(clean, "length_shift").details["avg_completion_tokens"]
    assert isinstance(avg, float)
    r = check(clean, "length_shift", previous=avg * 4)
    assert (r.passed, r.severity) == (False, "WARN")
    assert r.message == f"average completion length {avg:,.1f} tokens vs {avg * 4:,.1f} last time (-75.0%, limit ±50%)"
    assert r.figure == pytest.approx(-0.75)
    assert check(clean, "length_shift", previous=avg * 1.4).passed
    assert check(clean, "length_shift", previous=None).passed


def test_checks_follow_the_frame_they_are_handed(clean: pl.DataFrame) -> None:
    regression = regression_frame(100, dataset="other")
    both = pl.concat([clean, regression])
    assert check(clean, "empty_response").passed
    assert not check(regression, "empty_response").passed
    mixed = check(both, "empty_response")
    assert not mixed.passed and mixed.message.startswith("29.1% of 299 replies were empty")  # 87 of 299 answered


def test_a_shard_with_no_answered_row_fails_empty_response_and_passes_the_rest(clean: pl.DataFrame) -> None:
    for frame in (clean.clear(), set_rows(clean, list(range(200)), status="failed")):
        results = {r.name: r for r in run_checks(frame, Inputs(THRESHOLDS, True, 100.0))}
        assert not results["empty_response"].passed
        assert results["empty_response"].message.startswith("no answered rows to judge")
        assert [name for name, r in results.items() if not r.passed and name != "failed_rate"] == ["empty_response"]


def test_empty_response_judges_truncated_rows_too(clean: pl.DataFrame) -> None:
    cut = set_rows(clean, list(range(20, 28)), status="truncated", finish_reason="length", loss_tokens=0, content="")
    r = check(cut, "empty_response")
    assert not r.passed and r.message.startswith("4.0% of 199 replies were empty or had loss-mask sum <= 16")


def test_lost_text_fails_when_the_engine_reported_tokens_the_text_lacks(clean: pl.DataFrame) -> None:
    stripped = set_rows(clean, list(range(20, 28)), completion_tokens=4096)  # the text holds a few hundred tokens
    r = check(stripped, "lost_text")
    assert (r.passed, r.severity, r.blocking) == (False, "ERROR", True)
    assert r.figure == pytest.approx(8 / 199)
    assert r.message.startswith("4.0% of 199 replies lost text: their text holds under 90% of the tokens")
    assert check(set_rows(clean, [20], completion_tokens=4096), "lost_text").passed  # 0.5%: under the limit
    assert check(clean, "lost_text").details["token_ratio"] == 1.0


def test_a_bad_shard_is_not_hidden_among_good_ones(clean: pl.DataFrame) -> None:
    bad = set_rows(clean_frame(100, seed=2, dataset="c"), list(range(20, 40)), status="truncated")
    frames = {"00002": bad, "00000": clean, "00001": clean_frame(200, seed=1, dataset="b")}
    assert check(pl.concat(list(frames.values())), "truncation_rate").passed  # 5.2% over all shards: not sure
    results = {r.name: r for r in combine({k: run_checks(f, Inputs(THRESHOLDS, True)) for k, f in frames.items()})}
    r = results["truncation_rate"]
    assert not r.passed
    assert r.message == (
        "shard 00002: 22.2% of 99 replies hit max_tokens (limit 5%; at least 12.1% at 99.9% confidence: over it)"
    )
    passing = results["failed_rate"]  # each shard has 1 failed row: 1% of 100 is closest to the 2% limit
    assert passing.message == "all 3 shards pass; closest, shard 00002: 1.0% of 100 requests failed (limit 2%)"


def test_one_shard_gives_the_same_results_as_run_checks(clean: pl.DataFrame) -> None:
    inputs = Inputs(THRESHOLDS, True)
    assert combine({"00000": run_checks(clean, inputs)}) == run_checks(clean, inputs)


def test_a_shard_that_keeps_no_training_row_fails_a_blocking_check(clean: pl.DataFrame) -> None:
    """Every reply answered and well shaped, every one rejected (no reasoning while thinking is on, a
    non-blocking error alone): no blocking check used to fail, so validation was green with nothing to train on."""
    complete = clean.filter(pl.col("status") == "ok")
    frame = set_rows(complete, list(range(complete.height)), reasoning="")
    r = check(frame, "empty_response")
    assert (r.passed, r.blocking) == (False, True)
    assert r.message.startswith(f"the shard keeps no training row (missing_reasoning {complete.height})")
    assert "\n" not in r.message
    assert check(clean, "empty_response").passed


def test_rows_recorded_failed_after_billed_empty_or_lost_replies_fail_their_gate_as_well_as_failed_rate(
    clean: pl.DataFrame,
) -> None:
    """The runner records a row `failed` after its billed replies came back empty (`empty_reply: ...`) or without
    their text (`lost_text: ...`): failed_rate fails, and so does the gate of the cause."""
    with_errors = clean.with_columns(error=pl.lit(""))
    empty = set_rows(with_errors, list(range(20, 50)), status="failed", error="empty_reply: no content")
    lost = set_rows(with_errors, list(range(20, 50)), status="failed", error="lost_text: 1 bytes of text")
    assert not check(empty, "failed_rate").passed and not check(lost, "failed_rate").passed
    r = check(empty, "empty_response")
    assert not r.passed and r.message.startswith("15.1% of 199 replies were empty or had loss-mask sum <= 16, 30 of")
    assert "after empty replies (see empty_response)" in check(empty, "failed_rate").message
    r = check(lost, "lost_text")
    assert not r.passed and r.message.startswith("15.1% of 199 replies lost text (30 failed after such replies)")
    assert check(empty, "lost_text").passed and check(lost, "empty_response").passed
