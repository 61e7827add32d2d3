"""Data-quality gates: per-row verdicts, dataset-level checks and report figures over polars frames.

Rooms: `registry` (every check of the project declared once: asset, severity, blocking, alert, repair),
`verdicts` (one reason per row, the train/rejected split), `summary` (the counts everything
else reads), `gates` (the dataset checks and their thresholds from the catalog), `figures` (metadata
numbers, markdown tables, histogram bins), `records` (the typed, versioned per-shard record written
once at validation), `rollup` (shard records added up for dataset reports and range checks), `canary`
(a sample drawn across a dataset, judged by the same verdicts and gates before generation is paid for),
`evalsets` (the benchmark items, from a folder, packages or the hub) and `decontam` (the gate's overlap test
against them: the `contamination` column and the `decontamination` check's scan).
Pure: no Dagster here; `eagle_data/defs/checks.py` turns the stored records' results into asset checks.
"""

from eagle_data.quality.canary import Canary, LatestCanary, canary_blocks, canary_stale
from eagle_data.quality.figures import Figures, figures
from eagle_data.quality.gates import CHECKS, CheckDef, CheckResult, Inputs, combine, evaluate, run_checks
from eagle_data.quality.records import SCHEMA_VERSION, ShardRecord, shard_record
from eagle_data.quality.rollup import rollup
from eagle_data.quality.summary import Summary, summarize
from eagle_data.quality.verdicts import CHECK_COLUMNS, KEPT, LOST_TEXT, row_verdicts, split_rows

__all__ = [
    "CHECKS",
    "CHECK_COLUMNS",
    "KEPT",
    "LOST_TEXT",
    "SCHEMA_VERSION",
    "Canary",
    "CheckDef",
    "CheckResult",
    "Figures",
    "Inputs",
    "LatestCanary",
    "ShardRecord",
    "Summary",
    "canary_blocks",
    "canary_stale",
    "combine",
    "evaluate",
    "figures",
    "rollup",
    "row_verdicts",
    "run_checks",
    "shard_record",
    "split_rows",
    "summarize",
]
