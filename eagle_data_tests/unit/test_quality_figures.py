"""Report figures: histogram bins, numeric metadata, markdown tables, per-shard trends."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest

from eagle_data.catalog import Checks
from eagle_data.quality import Inputs, ShardRecord, figures, rollup, row_verdicts, shard_record, summarize
from eagle_data.quality.figures import EDGES, count_numbers, histogram, markdown_table
from eagle_data_tests.fixtures_quality import clean_frame, regression_frame, set_rows

THRESHOLDS = Checks()


def verdicted(frame: pl.DataFrame) -> pl.DataFrame:
    return row_verdicts(frame, THRESHOLDS, True)


def test_histogram_puts_each_value_in_its_doubling_bin() -> None:
    bins = dict(histogram(pl.Series([0, 6, 7, 8, 15, 16, 5000, 9000, 100_000, None])))
    assert list(bins) == ["0–7", "8–15", "16–31", "32–63", "64–127", "128–255", "256–511", "512–1023",
                          "1024–2047", "2048–4095", "4096–8191", "8192+"]  # fmt: skip
    assert (bins["0–7"], bins["8–15"], bins["16–31"], bins["4096–8191"], bins["8192+"]) == (3, 2, 1, 1, 2)
    assert sum(bins.values()) == 9 and len(bins) == len(EDGES)


def test_regression_figures_show_the_spike_at_loss_sum_6() -> None:
    fig = figures(verdicted(regression_frame()), THRESHOLDS)
    assert fig.loss_hist[0] == ("0–7", 174)
    assert fig.numbers["short_share"] == pytest.approx(0.87)
    assert fig.numbers["top_loss_share"] < 0.05  # the 174 short rows are short_loss, not also one dominant sum
    assert fig.numbers["train_rows"] == 26 and fig.numbers["rejected_rows"] == 174
    assert "| 6 | 174 | 87.0% |" in fig.tables["top_loss_sums"]
    assert "| short_loss | 174 |" in fig.tables["verdicts"]


def test_numbers_are_plain_numbers_and_tables_are_markdown() -> None:
    fig = figures(verdicted(clean_frame()), THRESHOLDS)
    assert all(type(v) in (int, float) for v in fig.numbers.values())
    assert fig.numbers["truncated_share"] == pytest.approx(2 / 199)
    assert fig.numbers["failed_share"] == pytest.approx(1 / 200)
    assert fig.numbers["p50_completion_tokens"] <= fig.numbers["p90_completion_tokens"]
    assert fig.numbers["max_completion_tokens"] == clean_frame()["completion_tokens"].max()
    assert all(t.startswith("| ") and "\n|---|" in t for t in fig.tables.values())
    assert "shards" not in fig.tables and fig.shards == []  # one frame: trends come from the roll-up


def test_engine_id_mismatches_are_counted_not_rejected() -> None:
    frame = set_rows(clean_frame(), [0, 1, 2, 3], ids_match=True)
    frame = set_rows(frame, [0], ids_match=False)
    fig = figures(verdicted(frame), THRESHOLDS)
    assert fig.numbers["ids_mismatch_share"] == pytest.approx(0.25)  # of the 4 rows with engine ids
    assert fig.numbers["train_rows"] == 199


def test_markdown_table_renders_rows() -> None:
    assert markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |"


def test_rollup_of_shard_records_adds_up_like_the_whole_frame() -> None:
    shards = {
        "00000": verdicted(clean_frame(120, seed=1, dataset="a")),
        "00001": verdicted(regression_frame(80, dataset="b")),
        "00002": verdicted(clean_frame(60, seed=2, dataset="c")),
    }
    records = [
        ShardRecord.from_json(shard_record(k, f, Inputs(THRESHOLDS, True)).to_json())
        for k, f in reversed(shards.items())
    ]  # stored as JSON, read back in any order
    assert all(records)
    fig, results = rollup(records)
    whole = figures(pl.concat(list(shards.values())), THRESHOLDS)
    assert fig.completion_hist == whole.completion_hist and fig.loss_hist == whole.loss_hist
    assert fig.ratio_hist == whole.ratio_hist and sum(n for _, n in fig.ratio_hist) == 258  # answered rows
    names = ("rows", "train_rows", "truncated_share", "failed_share", "short_share", "loss_tokens_total", "token_ratio")
    for name in names:
        assert fig.numbers[name] == pytest.approx(whole.numbers[name]), name
    assert fig.numbers["avg_completion_tokens"] == pytest.approx(whole.numbers["avg_completion_tokens"])
    assert fig.numbers["short_share"] == pytest.approx(70 / 258)  # shard 00001's 70 "OK." rows, counted once
    assert fig.verdicts == whole.verdicts
    assert [r["shard"] for r in fig.shards] == ["00000", "00001", "00002"]
    by_name = {r.name: r for r in results}
    empty = by_name["empty_response"].message
    assert empty.startswith("shard 00001: 87.5% of 80 replies were empty or had loss-mask sum <= 16")
    assert by_name["token_structure"].message.startswith("all 3 shards pass; closest, shard 00000: ")


def test_rollup_numbers_are_the_count_figures_of_the_summed_counts() -> None:
    """The roll-up adds the shards' counts and reads them through count_numbers, as one frame would."""
    shards = {
        "00000": verdicted(clean_frame(120, seed=1, dataset="a")),
        "00001": verdicted(set_rows(clean_frame(80, seed=3, dataset="b"), list(range(30)), status="failed")),
        "00002": verdicted(regression_frame(60, dataset="c")),
    }
    records = [shard_record(k, f, Inputs(THRESHOLDS, True)) for k, f in shards.items()]
    numbers = rollup(records)[0].numbers
    whole = count_numbers(summarize(pl.concat(list(shards.values())), THRESHOLDS))
    additive = {k: v for k, v in whole.items() if k not in ("top_loss_share", "repeat_share", "avg_completion_tokens")}
    assert {k: numbers[k] for k in additive} == additive  # exactly: shares of the same integer counts
    assert numbers["avg_completion_tokens"] == pytest.approx(whole["avg_completion_tokens"])
    assert set(numbers) - set(whole) == {"shards", "top_loss_share_worst_shard", "repeat_share_worst_shard",
                                         "loss_tokens_total", "max_completion_tokens"}  # fmt: skip
    assert numbers["failed_share"] == 31 / 260 and numbers["shards"] == 3


def test_a_record_judged_by_other_check_definitions_is_stale() -> None:
    """A record stored while failed_rate only warned must not keep it non-blocking: it is rebuilt."""
    record = shard_record("00000", verdicted(clean_frame()), Inputs(THRESHOLDS, True))
    assert ShardRecord.from_json(record.to_json()) == record
    warned = [replace(r, severity="WARN", blocking=False) if r.name == "failed_rate" else r for r in record.results]
    assert ShardRecord.from_json(replace(record, results=warned).to_json()) is None


def test_rollup_without_records_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="materialize a validated shard first"):
        rollup([])
