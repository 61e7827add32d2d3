"""A group backfill as the UI launches it ("Materialize all" on a dataset's group, every partition): the
GraphQL `launchPartitionBackfill` mutation, then the backfill daemon's own iteration, against the real
code location in a code server. Every asset of the group shares one partitioning and the single-run
policy, so the whole backfill is one run (it used to be three: prompts, estimate, the rest)."""

from __future__ import annotations

import logging

import dagster as dg
import pytest
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster_graphql.test.utils import execute_dagster_graphql

from eagle_data.catalog import catalog

LAUNCH_BACKFILL = """
mutation LaunchBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""
QUEUED = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}  # runs stay queued


def test_materialize_all_on_a_dataset_group_is_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")  # the code server inherits it: 4 partitions per dataset
    spec = catalog()["b7_sharegpt"]
    group = [f"{spec.name}_prompts", f"{spec.name}_estimate", spec.name, f"{spec.name}_validated"]
    target = ModuleTarget(module_name="eagle_data.definitions", attribute=None, working_directory=None,
                          location_name="eagle_data")  # fmt: skip
    with dg.instance_for_test(overrides={"run_coordinator": QUEUED}) as instance:
        with create_test_daemon_workspace_context(target, instance) as workspace:
            # What the dialog sends for a group in the hidden asset job with every shard selected (the browser
            # test sees it so): the keys themselves (`LaunchAssetChoosePartitionsDialog.tsx`).
            params = {"assetSelection": [{"path": [name]} for name in group], "partitionNames": spec.partition_keys,
                      "fromFailure": False}  # fmt: skip
            launched = execute_dagster_graphql(workspace.create_request_context(), LAUNCH_BACKFILL, {"params": params})
            assert launched.data["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", launched.data
            for _ in range(2):  # the daemon's first iteration requests the runs; the second finds nothing left
                list(execute_backfill_iteration(workspace, logging.getLogger("backfill")))
        runs = instance.get_runs()
    assert len(runs) == 1, [sorted(k.to_user_string() for k in r.asset_selection or ()) for r in runs]
    [run] = runs
    assert sorted(k.to_user_string() for k in run.asset_selection or ()) == sorted(group)
    assert (run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]) == (
        spec.partition_keys[0], spec.partition_keys[-1])  # fmt: skip
