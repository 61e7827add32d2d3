"""The static HTML report: self-contained, well-formed SVG charts, escaped text, failures visible."""

from __future__ import annotations

import json
import re
import threading
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import polars as pl

from eagle_data import layout
from eagle_data.catalog import Adapter, Checks, DatasetSpec
from eagle_data.quality import Inputs, figures, rollup, row_verdicts, run_checks, shard_record
from eagle_data.quality.records import Judged
from eagle_data.report import (
    bar_chart,
    inputs_for,
    read_record,
    record_judged,
    render_report,
    stored_record,
    write_dataset_report,
    write_shard_report,
)
from eagle_data.storage import ShardStore, digest
from eagle_data_tests.fixtures_quality import clean_frame, regression_frame, set_rows

THRESHOLDS = Checks()
SVG = re.compile(r"<svg .*?</svg>", re.S)


def report(frame: pl.DataFrame, title: str = "b7_sharegpt quality") -> str:
    frame = row_verdicts(frame, THRESHOLDS, True)
    results = run_checks(frame, Inputs(THRESHOLDS, True))
    page = render_report(title, figures(frame, THRESHOLDS), results)
    assert isinstance(page, bytes)
    return page.decode()


def test_regression_report_shows_the_failed_check_and_the_spike() -> None:
    page = report(regression_frame())
    row = re.search(r"<tr><td>empty_response</td>.*?</tr>", page)
    assert row and 'class="fail">FAIL<' in row.group()
    assert "87.0% of 200 replies were empty or had loss-mask sum" in row.group()
    assert "<title>0–7: 174</title>" in page  # the loss-mask histogram bar of the empty replies


def test_charts_are_well_formed_svg_with_one_bar_per_bin() -> None:
    charts = SVG.findall(report(clean_frame()))
    assert len(charts) == 3  # completion tokens, loss-mask sums, token accounting; one frame: no trends
    for svg, bins in zip(charts, (12, 12, 9), strict=True):
        root = ET.fromstring(svg)
        assert len(root.findall("{http://www.w3.org/2000/svg}rect")) == bins


def test_per_shard_trend_charts_appear_in_the_roll_up_of_several_shards() -> None:
    inputs = Inputs(THRESHOLDS, True)
    records = [shard_record(f"0000{s}", row_verdicts(clean_frame(40, seed=s, dataset=f"d{s}"), THRESHOLDS, True),
                            inputs) for s in range(3)]  # fmt: skip
    page = render_report("b7_sharegpt quality", *rollup(records)).decode()
    charts = SVG.findall(page)
    assert len(charts) == 5
    trend = ET.fromstring(charts[3])
    assert len(trend.findall("{http://www.w3.org/2000/svg}polyline")) == 3  # truncated, failed, short
    assert "<td>00002</td>" in page


def test_text_from_the_data_is_escaped() -> None:
    frame = set_rows(clean_frame(), list(range(20, 40)), content="<script>alert(1)</script>")
    page = report(frame, title="a <b> title")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<title>a &lt;b&gt; title</title>" in page


def test_the_page_needs_nothing_from_outside() -> None:
    page = report(clean_frame())
    assert not re.search(r"""(src|href)=["']?https?:""", page)


def test_bar_chart_of_no_data_draws_empty_bars() -> None:
    root = ET.fromstring(bar_chart([("0–7", 0), ("8+", 0)], "empty"))
    assert [r.get("height") for r in root.findall("{http://www.w3.org/2000/svg}rect")] == ["0.0", "0.0"]


def write_reports(spec: DatasetSpec, store: ShardStore, frames: dict[str, pl.DataFrame]) -> str:
    """What validation does per run: each shard verdicted (with its Int32 shard column) and reported."""
    for key, frame in frames.items():
        shard = row_verdicts(frame, spec.checks, spec.generation.thinking).with_columns(
            pl.lit(int(key), pl.Int32).alias("shard")
        )
        record = shard_record(key, shard, inputs_for(spec))  # the digest of bytes not stored here
        write_shard_report(spec, store, replace(record, shard_sha256=digest(key.encode())))
    return write_dataset_report(spec, store).uri


def test_write_reports_keeps_a_page_per_shard_and_rolls_up_the_dataset(tmp_path: Path) -> None:
    spec = DatasetSpec(name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"))
    store = ShardStore(str(tmp_path))
    uri = write_reports(spec, store, {"00001": regression_frame(100, dataset="r"), "00000": clean_frame(100)})
    assert uri == f"{tmp_path}/b9_fixture/b9_fixture_quality/index.html"
    page = Path(uri).read_text()
    assert "Fixture (b9_fixture): 2 of 200 shards" in page
    row = re.search(r"<tr><td>empty_response</td>.*?</tr>", page)
    assert row and 'class="fail">FAIL<' in row.group() and "shard 00001: 87.0% of" in row.group()
    assert store.list("b9_fixture/b9_fixture_quality") == [
        f"b9_fixture/b9_fixture_quality/{name}"
        for name in ("00000.html", "00000.json", "00001.html", "00001.json", "index.html")
    ]
    write_reports(spec, store, {"00002": clean_frame(50, seed=5, dataset="c")})  # a later run, one shard
    page = Path(uri).read_text()
    assert "3 of 200 shards" in page and "<td>00002</td>" in page and "shard 00001: 87.0%" in page


def test_a_record_of_an_older_schema_is_rebuilt_from_its_shard_with_one_notice(tmp_path: Path) -> None:
    """Records written before versioning were untyped dicts; they still read, rebuilt from the shard."""
    spec = DatasetSpec(name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"))
    store = ShardStore(str(tmp_path))
    shard = row_verdicts(regression_frame(100, dataset="r"), spec.checks, spec.generation.thinking)
    store.write_shard(spec.name, "b9_fixture_validated", "00001", shard)
    old = {"partition": "00001", "summary": {"rows": 100}, "numbers": {}, "results": []}  # the pre-version shape
    store.write_bytes(layout.quality_record(spec.name, "00001"), json.dumps(old).encode())
    notices: list[str] = []
    record = read_record(spec, store, "00001", notices.append)
    assert notices == [
        "b9_fixture shard 00001: quality record missing or of an older schema; rebuilt from the validated shard"
    ]
    data = store.shard_bytes(spec.name, "b9_fixture_validated", "00001")
    rebuilt = shard_record("00001", shard, inputs_for(spec))
    assert record == replace(rebuilt, shard_sha256=digest(data), shard_size=len(data))
    assert read_record(spec, store, "00001", notices.append) == record and len(notices) == 1  # stored: read as is
    stricter = spec.model_copy(update={"checks": spec.checks.model_copy(update={"max_short_share": 0.5})})
    assert read_record(stricter, store, "00001", notices.append).inputs.checks.max_short_share == 0.5
    assert notices[-1].endswith("quality record judged with other thresholds; rebuilt from the validated shard")


def test_the_dataset_page_links_each_shard_page_and_names_every_check_of_the_asset(tmp_path: Path) -> None:
    from eagle_data.quality import registry

    spec = DatasetSpec(name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"))
    uri = write_reports(spec, ShardStore(str(tmp_path)), {"00000": clean_frame(60), "00001": clean_frame(40, seed=3)})
    page = Path(uri).read_text()
    links = re.findall(r'<a href="([^"]+)">', page)
    assert links == ["00000.html", "00001.html"]
    assert all((Path(uri).parent / link).is_file() for link in links)  # relative: opens from a folder or a download
    named = set(re.findall(r"<tr><td>([a-z_]+)</td>", page))
    assert {d.name for d in registry.CHECKS if d.stage == "validated"} | {"on_policy"} <= named  # gates, decon
    assert "b9_fixture_decontamination" in page and "b9_fixture_validated's Checks tab" in page
    assert "b9_fixture_on_policy" in page


def test_the_asset_pages_shard_table_shows_the_worst_shards_and_stays_bounded(tmp_path: Path) -> None:
    spec = DatasetSpec(name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"))
    store = ShardStore(str(tmp_path))
    frames = {f"0000{i}": clean_frame(20, seed=i, dataset=f"d{i}") for i in range(4)}
    frames["00002"] = regression_frame(20, dataset="r")  # most of its rows rejected
    write_reports(spec, store, frames)
    report = write_dataset_report(spec, store)
    table = report.shards_table(limit=2)
    shown = re.findall(r"^\| (0000\d) \|", table, re.M)
    assert "00002" in shown and len(shown) == 2 and shown == sorted(shown)
    assert table.endswith("2 more shards on the report page")
    assert re.findall(r"^\| (0000\d) \|", report.shards_table(), re.M) == sorted(frames)


class _FirstWriteWaits(ShardStore):
    """A real folder store on which one thread's first write under the quality folder waits until `released`:
    the interleaving of two check steps (decontamination, on_policy) that a loaded machine produces."""

    def __init__(self, root: str, waiter: str, released: threading.Event) -> None:
        super().__init__(root)
        self.waiter, self.released, self.waiting = waiter, released, threading.Event()

    def write_bytes(self, key: str, data: bytes) -> str:
        if threading.current_thread().name == self.waiter and not self.waiting.is_set() and "_quality/" in key:
            self.waiting.set()
            assert self.released.wait(30)
        return super().write_bytes(key, data)


def test_two_checks_judged_side_by_side_both_keep_their_outcome(tmp_path: Path) -> None:
    """Regression: decontamination and on_policy run as parallel steps, and each rewrote the shard's one record
    (read, add its outcome, write): one step's write between the other's read and write lost an outcome, and
    the export then refused the shard ("on_policy never ran"). Each outcome is now its own object."""
    spec = DatasetSpec(name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"))
    write_reports(spec, ShardStore(str(tmp_path)), {"00000": clean_frame(100)})
    released = threading.Event()
    store = _FirstWriteWaits(str(tmp_path), "decontamination", released)
    sha = digest(b"00000")
    steps = {
        check: threading.Thread(name=check, target=record_judged,
                                args=(spec, store, "00000", Judged(check, True, f"{check} passed", sha, "run-1")))
        for check in ("decontamination", "on_policy")
    }  # fmt: skip
    steps["decontamination"].start()
    assert store.waiting.wait(30)  # decontamination is about to write: on_policy judges now
    steps["on_policy"].start()
    steps["on_policy"].join(30)
    released.set()
    steps["decontamination"].join(30)
    record = stored_record(spec, ShardStore(str(tmp_path)), "00000")
    assert record is not None and set(record.outcomes()) >= {"decontamination", "on_policy"}
    assert all(record.outcomes()[c].passed for c in ("decontamination", "on_policy"))


def test_a_check_judged_after_validation_shows_its_stored_outcome_on_the_shard_page_and_the_index(
    tmp_path: Path,
) -> None:
    """decontamination stores its outcome in the shard's record: the pages read it there, not from Dagster."""
    spec = DatasetSpec(name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"))
    store = ShardStore(str(tmp_path))
    uri = write_reports(spec, store, {"00000": clean_frame(100), "00001": clean_frame(100, seed=3)})
    assert "not judged yet" in Path(uri).read_text()
    for key, passed in (("00000", True), ("00001", False)):
        judged = Judged("decontamination", passed, f"shard {key} said so", digest(key.encode()), "run-1")
        record_judged(spec, store, key, judged)
    shard_page = (tmp_path / layout.quality_page(spec.name, "00001")).read_text()
    assert re.search(r'<td>decontamination</td><td class="fail">FAIL</td>.*?shard 00001 said so', shard_page)
    index = Path(write_dataset_report(spec, store).uri).read_text()
    assert "not judged yet" not in index
    assert re.search(r'<td>decontamination</td><td class="fail">FAIL</td><td>ERROR \(blocking\)</td>'
                     r"<td>1 of 2 shards failed \(00001: shard 00001 said so\)</td>", index)  # fmt: skip
