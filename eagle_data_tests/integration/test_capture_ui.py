"""A capture shard materialized as the UI does it, on the demo profile, against the real code location in a code
server and the project's instance settings: "Materialize" on `hidden_states`, one partition picked, "Launch 1
run". For one key the dialog launches a single run, not a backfill (`LaunchAssetChoosePartitionsDialog.tsx`:
`launchAsBackfill` only for several keys): it reads the partition's tags and run config of the asset's hidden
job (`ConfigPartitionForAssetJobQuery`), then sends `launchPipelineExecution` with the asset, its checks in that
job and those tags plus `dagster/from_ui`. The run queue's iteration then launches it, as `dagster dev`'s daemon
does, and the default run launcher executes it in a worker process of the code server."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster_graphql.test.utils import execute_dagster_graphql

from eagle_data import layout
from eagle_data.catalog import load_catalog
from eagle_data.defs.drafter import follow_the_mix
from eagle_data.defs.instance import latest_materializations
from eagle_data.defs.metadata import SHARD_DIGEST
from eagle_data.drafter import verify
from eagle_data_tests.fixtures_checks import latest_evaluations
from eagle_data_tests.integration.test_drafter_capture import mix_frame, write_mix

ROOT = Path(__file__).resolve().parents[2]
KEY = dg.AssetKey(layout.HIDDEN_STATES_ASSET)
SHARD, ROWS = "00000", 6

# The fields of the UI's `LaunchAssetLoaderQuery` that pick the job and the checks to launch.
ASSET_NODE = """
query AssetNode($assetKeys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $assetKeys) {
    jobNames
    repository { name location { name } }
    assetChecksOrError { ... on AssetChecks { checks { name jobNames } } }
  }
}"""
# The UI's own query and mutation (`ConfigFetch.tsx`, `RunUtils.tsx`), the error fragment spelled out.
CONFIG_PARTITION = """
query ConfigPartitionForAssetJobQuery($repositoryName: String!, $repositoryLocationName: String!,
    $jobName: String!, $partitionName: String!, $assetKeys: [AssetKeyInput!]!) {
  pipelineOrError(params: {pipelineName: $jobName, repositoryName: $repositoryName,
      repositoryLocationName: $repositoryLocationName}) {
    ... on Pipeline {
      id
      partition(partitionName: $partitionName, selectedAssetKeys: $assetKeys) {
        name
        runConfigOrError { ... on PartitionRunConfig { yaml } ... on PythonError { message } }
        tagsOrError { ... on PartitionTags { results { key value } } ... on PythonError { message } }
      }
    }
  }
}"""
LAUNCH = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { id pipelineName } }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message }
  }
}"""


def graphql(workspace: Any, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    result = execute_dagster_graphql(workspace.create_request_context(), query, variables)
    assert not result.errors, result.errors
    return result.data


def launch_one_partition(workspace: Any, partition: str) -> str:
    """What the dialog sends for one picked partition; returns the run id."""
    asset = {"path": KEY.path}
    [node] = graphql(workspace, ASSET_NODE, {"assetKeys": [asset]})["assetNodes"]
    job = node["jobNames"][0]  # `getCommonJob`: the first job every selected asset is in
    where = node["repository"]
    repo = {"repositoryLocationName": where["location"]["name"], "repositoryName": where["name"]}
    checks = node["assetChecksOrError"]["checks"]  # `getAssetCheckHandleInputs`: the asset's checks in that job
    handles = [{"name": c["name"], "assetKey": asset} for c in checks if job in c["jobNames"]]
    selector = {**repo, "pipelineName": job, "assetSelection": [asset], "assetCheckSelection": handles}
    found = {**repo, "jobName": job, "partitionName": partition, "assetKeys": [asset]}
    config = graphql(workspace, CONFIG_PARTITION, found)["pipelineOrError"]["partition"]
    tags = [*config["tagsOrError"]["results"], {"key": "dagster/from_ui", "value": "true"}]  # + `UI_EXECUTION_TAGS`
    params = {"mode": "default", "executionMetadata": {"tags": tags}, "selector": selector,
              "runConfigData": config["runConfigOrError"]["yaml"]}  # fmt: skip
    launched = graphql(workspace, LAUNCH, {"executionParams": params})["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["id"]


def run_to_end(workspace: Any, instance: dg.DagsterInstance, run_id: str, timeout: float = 180) -> dg.DagsterRun:
    """Dequeue the run (one iteration of the daemon's run queue), then wait for its worker to finish it."""
    with QueuedRunCoordinatorDaemon(interval_seconds=1) as queue:
        list(queue.run_iteration(workspace))
    deadline = time.monotonic() + timeout
    while (run := instance.get_run_by_id(run_id)) and not run.is_finished and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run and run.is_finished, f"run {run_id} still {run and run.status} after {timeout} s"
    return run


def step_errors(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """Why each failed step failed (a failed blocking check names itself and its shard there)."""
    failed = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    return [e.dagster_event.step_failure_data.error.message for e in failed if e.dagster_event]


def test_the_ui_materializes_a_capture_shard_on_the_demo_profile_with_its_checks_green(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_model: Path
) -> None:
    for name in [k for k in os.environ if k.startswith("EAGLE_DATA_")]:
        monkeypatch.delenv(name)
    out = tmp_path / "out"  # the code server and its run workers inherit these
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    monkeypatch.setenv("EAGLE_DATA_ROOT", str(out))
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model))
    specs = list(load_catalog(profile="demo").values())
    write_mix(out, mix_frame(specs[0].name, rows=ROWS, target="demo"))  # ids of the demo model's vocabulary
    settings = yaml.safe_load((ROOT / "dagster.yaml").read_text())  # the queue `dagster dev` uses
    target = ModuleTarget(module_name="eagle_data.definitions", attribute=None, working_directory=None,
                          location_name="eagle_data")  # fmt: skip
    with dg.instance_for_test(overrides=settings) as instance:
        follow_the_mix(instance, ROWS)  # what training_mix does
        with create_test_daemon_workspace_context(target, instance) as workspace:
            run_id = launch_one_partition(workspace, SHARD)
            assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.QUEUED
            run = run_to_end(workspace, instance, run_id)
        assert run.status == dg.DagsterRunStatus.SUCCESS, step_errors(instance, run_id)
        assert (run.tags["dagster/partition"], run.tags["dagster/from_ui"]) == (SHARD, "true")

        [record] = latest_materializations(instance, KEY, [SHARD]).values()
        metadata = record.asset_materialization.metadata
        assert record.run_id == run_id
        assert metadata["captured"].value is True and metadata["captured_rows"].value == ROWS
        path = Path(str(metadata["path"].value))
        assert path.is_relative_to(out)
        files = sorted(path.joinpath("specforge-eagle3").rglob("data_*.ckpt"))
        assert [f.name for f in files] == [f"data_{row}.ckpt" for row in range(ROWS)]
        assert all(f.stat().st_size > 0 for f in files)

        found = latest_evaluations(instance, [dg.AssetCheckKey(KEY, name) for name in verify.CHECKS], [SHARD])
        assert sorted(name for (name, _), e in found.items() if e.passed) == sorted(verify.CHECKS), found
        assert {(e.judged_run_id, e.shard_sha256) for e in found.values()} == {
            (run_id, str(metadata[SHARD_DIGEST].value))
        }
