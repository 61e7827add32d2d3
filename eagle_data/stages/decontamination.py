"""The benchmark-decontamination scan of validated shards: what the blocking `decontamination` check of every
`{ds}_validated` judges, one shard at a time; each shard's outcome is stored in its quality record, with the
digest of the bytes scanned (`record_outcome`), where the export's admission reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.quality import KEPT, decontam, registry
from eagle_data.quality.records import Judged
from eagle_data.report import Log, record_judged, validated_bytes
from eagle_data.storage import ShardStore, digest, read_columns

# quality.registry's `decontamination`, judged by decontamination_report (the check in defs/drafter.py reports it)
DECONTAMINATION = registry.implemented("decontamination", ("decontamination",))[0].name
SHOWN_IDS = 50  # prompt ids quoted in metadata (the full list would grow with the range)


@dataclass
class DecontamReport:
    """What the decontamination check found over a range of validated shards.

    `leaked` counts overlapping rows still kept for training (verdict pass or truncated): the check
    fails on any, since validation sets overlapping rows aside with the verdict `contaminated`. It also
    fails when a configured benchmark was not read (`unread`): "no overlap" with a benchmark never
    compared would be a false green.
    """

    unread: list[str] = field(default_factory=list)
    rows: int = 0
    matched: int = 0
    leaked: int = 0
    per_benchmark: dict[str, int] = field(default_factory=dict)
    per_match: dict[str, int] = field(default_factory=dict)
    matched_ids: list[str] = field(default_factory=list)
    leaked_ids: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)  # partition -> sha256 of the shard bytes scanned

    def add(self, shard: pl.DataFrame, found: pl.DataFrame) -> None:
        hits = found.join(shard.with_row_index("row").cast({"row": pl.Int64}), on="row")
        rows = hits.unique("row")
        leaked = rows.filter(pl.col("verdict").is_in(list(KEPT)))
        self.rows += shard.height
        self.matched += rows.height
        self.leaked += leaked.height
        for name, n in hits.unique(["row", "benchmark"]).group_by("benchmark").len().iter_rows():
            self.per_benchmark[name] = self.per_benchmark.get(name, 0) + n
        for kind, n in hits.unique(["row", "match"]).group_by("match").len().iter_rows():
            self.per_match[kind] = self.per_match.get(kind, 0) + n
        self.matched_ids.extend(rows["prompt_id"].head(SHOWN_IDS - len(self.matched_ids)).to_list())
        self.leaked_ids.extend(leaked["prompt_id"].head(SHOWN_IDS - len(self.leaked_ids)).to_list())

    @property
    def passed(self) -> bool:
        return self.leaked == 0 and not self.unread

    def message(self, asset: str) -> str:
        """The check's one line: what failed and what to do, or what passed."""
        if self.unread:
            return (
                f"benchmark(s) {', '.join(self.unread)} configured but not read (hub only, use_hub = false): set "
                "use_hub = true in [drafter.decontamination], or put their {name}.jsonl files in its folder, or "
                "drop them from [drafter.decontamination.benchmarks]"
            )
        if self.leaked:
            return (
                f"{self.leaked} row(s) kept for training overlap a benchmark: re-materialize {asset} to set them aside"
            )
        return f"{self.matched} of {self.rows} rows overlap a benchmark, all set aside"


def decontamination_report(
    dataset: str,
    store: ShardStore,
    partitions: Sequence[str],
    index: decontam.BenchmarkIndex,
    unread: Sequence[str] = (),
) -> DecontamReport:
    """Scan each validated shard of the range against the benchmark index, one shard in memory at a time;
    `unread` names the configured benchmarks the index lacks (evalsets.unread)."""
    report = DecontamReport(unread=list(unread))
    for key in partitions:
        data = validated_bytes(store, dataset, key)  # the bytes validation stored, or a one-line refusal
        shard = read_columns(data, ["prompt_id", "messages", "verdict"])  # no token lists
        report.add(shard, decontam.scan(shard, index))
        report.digests[key] = digest(data)
    return report


def record_outcome(
    spec: DatasetSpec, store: ShardStore, partition: str, report: DecontamReport, run_id: str, log: Log = print
) -> None:
    """Store the decontamination outcome of one shard (`report` scanned it alone) in its quality record."""
    message = report.message(layout.validated_asset(spec.name))
    judged = Judged(DECONTAMINATION, report.passed, message, report.digests[partition], run_id)
    record_judged(spec, store, partition, judged, log)
