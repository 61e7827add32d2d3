"""A backfill that ran a failed run ends "Failed", not "Succeeded".

Dagster's asset backfill daemon ends a backfill COMPLETED_FAILED only when a targeted partition has no
materialization (`dagster/_core/execution/asset_backfill.py`); a failed check does not count. A dataset
group's backfill is one run, which materializes every shard and then fails on a blocking quality gate, so
Dagster calls the backfill "Succeeded" while its one run is red. The `backfill_status` sensor (on by
default, every 60 s) finds such backfills and ends them COMPLETED_FAILED, naming the failed run and the
checks that stopped it on the backfill's page. A backfill whose failed run was re-executed to success is
left as Dagster ended it.
"""

from __future__ import annotations

import time

import dagster as dg

from eagle_data.defs import instance as records
from eagle_data.defs.checks import failed_blocking_checks

LOOKBACK_S = 7 * 24 * 3600  # backfills created this long ago or less are looked at
INTERVAL_S = 60  # two log lines per tick in `dagster dev`'s terminal (docs/running.md)


def failed_run_line(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """Why the backfill failed, in one line: the run, and the blocking checks that stopped it (if any)."""
    checks = sorted(set(failed_blocking_checks(instance, run.run_id)))
    stopped = f" on blocking check(s) {', '.join(checks)}" if checks else ""
    return (
        f"run {run.run_id} failed{stopped}, though every targeted partition materialized; open the run and its "
        "checks (eagle_data marked this backfill failed: Dagster counts only missing materializations)"
    )


def backfill_status_sensor() -> dg.SensorDefinition:
    @dg.sensor(
        name="backfill_status",
        minimum_interval_seconds=INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Ends a finished backfill Failed when one of its runs failed (on a blocking check, say), "
        "where Dagster would call it Succeeded because every partition materialized.",
    )
    def backfill_status(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        marked = []
        for backfill in records.succeeded_backfills(context.instance, time.time() - LOOKBACK_S):
            if failed := records.unrecovered_failures(context.instance, backfill.backfill_id):
                records.mark_backfill_failed(context.instance, backfill, failed_run_line(context.instance, failed[0]))
                marked.append(backfill.backfill_id)
        return dg.SkipReason(f"marked failed: {', '.join(marked)}" if marked else "no backfill to correct")

    return backfill_status
