"""Data-quality gates: per-row verdicts, dataset-level checks and report figures over polars frames.

Rooms: `verdicts` (one reason per row, the train/rejected split), `summary` (the counts everything
else reads), `gates` (the dataset checks and their thresholds from the catalog), `figures` (metadata
numbers, markdown tables, histogram bins), `rollup` (per-shard records added up for dataset reports).
Pure: no Dagster here; `eagle_data/defs/checks.py` wraps `run_checks_by_shard` as asset checks.
"""

from eagle_data.quality.figures import Figures, figures
from eagle_data.quality.gates import CHECKS, CheckDef, CheckResult, Inputs, run_checks, run_checks_by_shard
from eagle_data.quality.rollup import rollup, shard_record
from eagle_data.quality.summary import Summary, summarize
from eagle_data.quality.verdicts import CHECK_COLUMNS, KEPT, row_verdicts, split_rows

__all__ = [
    "CHECKS",
    "CHECK_COLUMNS",
    "KEPT",
    "CheckDef",
    "CheckResult",
    "Figures",
    "Inputs",
    "Summary",
    "figures",
    "rollup",
    "row_verdicts",
    "run_checks",
    "run_checks_by_shard",
    "shard_record",
    "split_rows",
    "summarize",
]
