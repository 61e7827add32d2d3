"""Checks re-runnable from the UI: the asset's Checks tab ("Execute all") launches a checks-only run of the
selected checks without a partition, which Dagster allows only for checks that can run on their own."""

from pathlib import Path

import dagster as dg
import pytest

from eagle_data import layout, quality
from eagle_data.catalog import Adapter, DatasetSpec, catalog
from eagle_data.defs.checks import build_checks, check_keys
from eagle_data.defs.estimate import estimate_asset
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter import verify
from eagle_data_tests.fixtures_quality import clean_frame, regression_frame

SPEC = DatasetSpec(name="b9_fixture", title="Fixture", adapter=Adapter(prompt_field="q", response_field="r"),
                   max_prompts=30, shard_size=10)  # fmt: skip
FRAMES = {"00000": clean_frame(), "00001": regression_frame(dataset="r")}


def test_every_quality_check_of_the_definitions_can_execute_on_its_own():
    """What the UI's `canExecuteIndividually` reads: a check outside any execution set."""
    from eagle_data.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = [key for spec in catalog().values() for key in check_keys(spec)]
    assert set(keys) <= set(graph.asset_check_keys)
    tied = [key.to_user_string() for key in keys if graph.get_execution_set_identifier(key)]
    assert not tied, f"checks that cannot execute without materializing their asset: {tied}"


CAN_EXECUTE = """
query CanExecute($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks { name canExecuteIndividually } } } }
  }
}"""


def can_execute(asset: str) -> dict[str, str]:
    """check name -> the `canExecuteIndividually` the Checks tab reads for one asset of the definitions."""
    from dagster._core.test_utils import in_process_test_workspace
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster_graphql.test.utils import execute_dagster_graphql

    origin = LoadableTargetOrigin(module_name="eagle_data.definitions")
    with dg.instance_for_test() as instance, in_process_test_workspace(instance, origin) as context:
        result = execute_dagster_graphql(context, CAN_EXECUTE, {"key": {"path": [asset]}})
    assert not result.errors, result.errors
    checks = result.data["assetNodeOrError"]["assetChecksOrError"]["checks"]
    return {c["name"]: c["canExecuteIndividually"] for c in checks}


def test_hidden_states_checks_can_execute_on_their_own_and_the_estimates_cannot():
    """The Checks tab's "Execute all" on hidden_states re-verifies the stored shards; the estimate's canary and
    budget judge a fresh sample in the estimate's own step, so its Checks tab keeps the button disabled."""
    assert can_execute(layout.HIDDEN_STATES_ASSET) == dict.fromkeys(verify.CHECKS, "CAN_EXECUTE")
    spec = next(iter(catalog().values()))
    assert set(can_execute(estimate_asset(spec)).values()) == {"REQUIRES_MATERIALIZATION"}


def stand_in_validated(spec: DatasetSpec) -> dg.AssetsDefinition:
    @dg.asset(name=f"{spec.name}_validated", group_name=spec.name,
              partitions_def=dg.StaticPartitionsDefinition(spec.partition_keys))  # fmt: skip
    def validated(context: dg.AssetExecutionContext, storage: StorageResource) -> None:
        frame = quality.row_verdicts(FRAMES[context.partition_key], spec.checks, spec.generation.thinking)
        storage.store().write_shard(spec.name, f"{spec.name}_validated", context.partition_key, frame)

    return validated


@pytest.fixture
def instance_with_two_shards(tmp_path: Path):
    defs = dg.Definitions(assets=[stand_in_validated(SPEC)], asset_checks=build_checks([SPEC]),
                          resources={**shard_resources(StorageResource(root=str(tmp_path)))})  # fmt: skip
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        for key in FRAMES:  # the asset alone: its checks are not part of these runs
            assets_only = job.get_subset(asset_selection={dg.AssetKey(f"{SPEC.name}_validated")},
                                         asset_check_selection=set())  # fmt: skip
            assert assets_only.execute_in_process(partition_key=key, instance=instance).success
        yield job, instance


def evaluations(result: dg.ExecuteInProcessResult) -> list[dg.AssetCheckEvaluation]:
    return [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def test_a_checks_only_run_without_a_partition_judges_each_materialized_shard(instance_with_two_shards):
    """What the Checks tab's "Execute all" launches: one evaluation per selected check and shard, each
    with its shard and the materialization it judged; the failed blocking gate fails the run."""
    job, instance = instance_with_two_shards
    chosen = next(k for k in check_keys(SPEC) if k.name == "empty_response")
    result = job.get_subset(asset_selection=set(), asset_check_selection={chosen}).execute_in_process(
        instance=instance, raise_on_error=False
    )
    found = {e.partition: e for e in evaluations(result)}
    assert set(found) == {"00000", "00001"} and {e.check_name for e in found.values()} == {"empty_response"}
    assert found["00000"].passed and not found["00001"].passed  # shard 00001 is the regression
    assert all(e.target_materialization_data is not None for e in found.values())
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "blocking check(s) failed: empty_response on 00001" in failure.event_specific_data.error.message
    status = {
        i.partition_key: i.latest_execution_status.value
        for i in instance.event_log_storage.get_asset_check_partition_info([chosen])
        if i.partition_key
    }
    assert status == {"00000": "SUCCEEDED", "00001": "FAILED"}


def test_a_checks_only_run_of_one_partition_judges_that_shard(instance_with_two_shards):
    job, instance = instance_with_two_shards
    result = job.get_subset(asset_selection=set(), asset_check_selection=set(check_keys(SPEC))).execute_in_process(
        instance=instance, partition_key="00000"
    )
    assert result.success
    found = evaluations(result)
    assert {e.check_name for e in found} == {d.name for d in quality.CHECKS}
    assert all(e.passed and e.partition == "00000" for e in found if e.severity == dg.AssetCheckSeverity.ERROR)


def test_a_checks_only_run_before_any_materialization_fails_with_one_line(tmp_path: Path):
    defs = dg.Definitions(assets=[stand_in_validated(SPEC)], asset_checks=build_checks([SPEC]),
                          resources={**shard_resources(StorageResource(root=str(tmp_path)))})  # fmt: skip
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        result = job.get_subset(asset_selection=set(), asset_check_selection=set(check_keys(SPEC))).execute_in_process(
            instance=instance, raise_on_error=False
        )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "no partition of b9_fixture_validated is materialized yet" in failure.event_specific_data.error.message
