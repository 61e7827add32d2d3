"""Row verdicts and the train/rejected split, on frames with real Qwen3 token ids."""

from __future__ import annotations

import polars as pl
import pytest

from eagle_data.catalog import Checks
from eagle_data.quality import row_verdicts, split_rows
from eagle_data_tests.fixtures_quality import EMPTY_REPLY_LOSS, clean_frame, regression_frame, set_rows

CHECKS = Checks()


@pytest.fixture(scope="module")
def clean() -> pl.DataFrame:
    return clean_frame()


def verdict_of(frame: pl.DataFrame, row: int, thinking: bool = True) -> str:
    return row_verdicts(frame, CHECKS, thinking)["verdict"][row]


def test_clean_fixture_rows_pass_except_the_truncated_and_failed_ones(clean: pl.DataFrame) -> None:
    counts = dict(row_verdicts(clean, CHECKS, True)["verdict"].value_counts().iter_rows())
    assert counts == {"pass": 197, "truncated": 2, "failed": 1}


def test_empty_ok_reply_has_loss_sum_6_and_is_short_loss() -> None:
    frame = row_verdicts(regression_frame(), CHECKS, True)
    empty = frame.filter(pl.col("content") == "OK.")
    assert empty.height == 174
    assert empty["loss_tokens"].unique().to_list() == [EMPTY_REPLY_LOSS]
    assert empty["loss_mask"].list.sum().unique().to_list() == [EMPTY_REPLY_LOSS]
    assert empty["verdict"].unique().to_list() == ["short_loss"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"status": "skipped_budget"}, "skipped_budget"),
        ({"target_error": "template: no user turn", "structure_ok": False}, "render_error"),
        ({"structure_ok": False}, "bad_structure"),
        ({"special_in_text": 2}, "special_token_in_text"),
        ({"roundtrip_ok": False}, "roundtrip_mismatch"),
        ({"prefix_ok": False}, "prefix_mismatch"),
        ({"ids_match": False}, "pass"),  # counted, not a reason: the model's own ids are kept
        ({"eot_ok": False}, "missing_eot"),
        ({"content": "  \n"}, "empty_completion"),
        ({"loss_tokens": CHECKS.min_loss_tokens}, "short_loss"),
        ({"loss_tokens": CHECKS.min_loss_tokens + 1}, "pass"),
        ({"reasoning": ""}, "missing_reasoning"),
        ({"finish_reason": "length"}, "truncated"),
        ({"completion_tokens": 4096}, "lost_text"),
    ],
)
def test_each_reason_is_detected(clean: pl.DataFrame, values: dict[str, object], expected: str) -> None:
    assert verdict_of(set_rows(clean, [0], **values), 0) == expected


def test_missing_reasoning_only_counts_when_thinking_is_on(clean: pl.DataFrame) -> None:
    frame = set_rows(clean, [0], reasoning="")
    assert verdict_of(frame, 0, thinking=True) == "missing_reasoning"
    assert verdict_of(frame, 0, thinking=False) == "pass"


def test_truncated_rows_skip_eot_check_but_not_structure_checks(clean: pl.DataFrame) -> None:
    assert clean["status"][3] == "truncated" and clean["eot_ok"][3] is False
    assert verdict_of(clean, 3) == "truncated"
    assert verdict_of(set_rows(clean, [3], structure_ok=False), 3) == "bad_structure"


def test_no_empty_row_is_kept_whatever_its_finish_reason(clean: pl.DataFrame) -> None:
    """A cut reply is kept only when it carries tokens: reasoning alone will do, nothing at all will not."""
    cut = {"status": "truncated", "finish_reason": "length"}
    assert verdict_of(set_rows(clean, [0], **cut, content=""), 0) == "truncated"  # cut while thinking
    assert verdict_of(set_rows(clean, [0], **cut, content="", reasoning=""), 0) == "empty_completion"
    assert verdict_of(set_rows(clean, [0], **cut, loss_tokens=0), 0) == "short_loss"
    assert verdict_of(set_rows(clean, [0], content="", loss_tokens=0), 0) == "empty_completion"


def test_token_accounting_tolerates_a_few_tokens_per_turn_and_the_catalog_share(clean: pl.DataFrame) -> None:
    """The engine may count a stop token or think tags the text leaves out; beyond that, the tolerance."""
    text = clean["reply_tokens"][0]
    slack = text + 4  # TURN_SLACK_TOKENS for one turn
    assert verdict_of(set_rows(clean, [0], completion_tokens=slack), 0) == "pass"
    at_limit = int((text + 4) / (1 - CHECKS.lost_text_tolerance))  # lost = 10% of reported, not more
    assert verdict_of(set_rows(clean, [0], completion_tokens=at_limit), 0) == "pass"
    assert verdict_of(set_rows(clean, [0], completion_tokens=at_limit + 2), 0) == "lost_text"
    assert verdict_of(set_rows(clean, [0], completion_tokens=0, reasoning_tokens=4096), 0) == "lost_text"
    assert verdict_of(set_rows(clean, [0], completion_tokens=0), 0) == "pass"  # nothing reported: not judged
    frame = row_verdicts(set_rows(clean, [0], completion_tokens=text * 4), CHECKS, True)
    assert frame["lost_tokens"][0] == text * 3 - 4 and frame["token_ratio"][0] == pytest.approx(0.25)
    assert frame["token_ratio"][11] is None  # a failed row has nothing to weigh


def test_frames_without_accounting_columns_are_not_judged_on_accounting(clean: pl.DataFrame) -> None:
    old = set_rows(clean, [0], completion_tokens=4096).drop("reply_tokens", "reply_turns")
    assert verdict_of(old, 0) == "pass"


def test_split_keeps_pass_and_truncated_and_sets_the_rest_aside_with_reasons() -> None:
    frame = row_verdicts(set_rows(clean_frame(), [0], structure_ok=False), CHECKS, True)
    train, rejected = split_rows(frame)
    assert train.height + rejected.height == frame.height
    assert set(train["verdict"]) == {"pass", "truncated"}
    assert dict(rejected.select("prompt_id", "verdict").iter_rows()) == {
        "fixture-00000": "bad_structure",
        "fixture-00011": "failed",
    }
    assert rejected.columns == frame.columns  # nothing dropped: the rows can be inspected later


def test_split_needs_verdicts_and_verdicts_need_the_columns(clean: pl.DataFrame) -> None:
    with pytest.raises(ValueError, match="row_verdicts first"):
        split_rows(clean)
    with pytest.raises(ValueError, match="eot_ok, ids_match"):
        row_verdicts(clean.drop("eot_ok", "ids_match"), CHECKS, True)
