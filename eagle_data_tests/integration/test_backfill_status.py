"""`backfill_status` on a real Dagster instance: which backfills Dagster ended "Succeeded" it ends "Failed".
The browser test (test_ui_bad_server.py) shows the failed case end to end; here each case on its own, on
records written as the daemon writes them, in a second."""

from __future__ import annotations

import time
import uuid

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.tags import BACKFILL_ID_TAG, ROOT_RUN_ID_TAG

from eagle_data.defs.backfills import LOOKBACK_S, backfill_status_sensor


def backfill(
    instance: dg.DagsterInstance, runs: list[tuple[dg.DagsterRunStatus, str | None]], age_s: float = 60
) -> str:
    """A backfill Dagster ended COMPLETED_SUCCESS, `age_s` ago, with runs of the given status (and, for a
    re-execution, the index of the run it re-executes, as the ROOT_RUN_ID_TAG Dagster sets)."""
    backfill_id = uuid.uuid4().hex[:8]
    instance.add_backfill(
        PartitionBackfill(backfill_id, BulkActionStatus.COMPLETED_SUCCESS, from_failure=False, tags={},
                          backfill_timestamp=time.time() - age_s, asset_selection=[dg.AssetKey("b3_magicoder")])
    )  # fmt: skip
    ids: list[str] = []
    for status, root in runs:
        tags = {BACKFILL_ID_TAG: backfill_id, **({ROOT_RUN_ID_TAG: ids[int(root)]} if root is not None else {})}
        run = instance.add_run(
            dg.DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=status, tags=tags)
        )
        ids.append(run.run_id)
    return backfill_id


def test_only_a_backfill_with_an_unrecovered_failed_run_is_ended_failed():
    failure, success = dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.SUCCESS
    with dg.instance_for_test() as instance:
        failed = backfill(instance, [(success, None), (failure, None)])
        recovered = backfill(instance, [(failure, None), (success, "0")])  # re-executed to success: left alone
        clean = backfill(instance, [(success, None)])
        old = backfill(instance, [(failure, None)], age_s=LOOKBACK_S + 3600)  # past the lookback: not looked at
        sensor = backfill_status_sensor()
        result = sensor(dg.build_sensor_context(instance=instance))
        status = {b: instance.get_backfill(b) for b in (failed, recovered, clean, old)}
        assert status[failed].status == BulkActionStatus.COMPLETED_FAILED
        [failed_run] = instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: failed}, statuses=[failure]))
        assert status[failed].error is not None and status[failed].error.message.startswith(
            f"run {failed_run.run_id} failed, though every targeted partition materialized"
        )
        assert [status[b].status for b in (recovered, clean, old)] == [BulkActionStatus.COMPLETED_SUCCESS] * 3
        assert isinstance(result, dg.SkipReason) and result.skip_message == f"marked failed: {failed}"
        again = sensor(dg.build_sensor_context(instance=instance))  # the next tick: nothing left to correct
        assert isinstance(again, dg.SkipReason) and again.skip_message == "no backfill to correct"
