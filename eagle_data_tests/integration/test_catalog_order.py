"""Catalog order through Dagster: each dataset is an ordinary run of its assets, the next starts when the
previous one's run ends, generation sits in its engine's pool, and the pre-flight estimate's blocking
`within_budget` check stops a dataset whose projection exceeds its budget (a real instance, the demo model)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from eagle_data.catalog import DatasetSpec, catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.catalog_order import ORDER_TAG, catalog_order_sensor, waits_on
from eagle_data.defs.checks import build_checks
from eagle_data.defs.estimate import CANARY, WITHIN_BUDGET
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data.storage import ShardStore
from eagle_data_tests.fixtures_stages import STANDIN_TARGET

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo_specs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[DatasetSpec]]:
    """b3, then b5 with a token budget far below its projection; two shards each."""
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    specs = catalog()
    small = {"max_prompts": 20, "target": STANDIN_TARGET}  # served by a stand-in
    yield [specs["b3_magicoder"].model_copy(update=small),
           specs["b5_openthoughts"].model_copy(update={**small, "token_budget": 1_000})]  # fmt: skip


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """A real instance with the repository's dagster.yaml (pools: one generation step per engine)."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance


def _tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None):
    sensor = defs.get_sensor_def("catalog_order")
    with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs) as context:
        return sensor.evaluate_tick(context)


def _status(instance: dg.DagsterInstance, dataset: str) -> dg.DagsterRunStatus | None:
    runs = instance.get_runs(dg.RunsFilter(tags={ORDER_TAG: dataset}), limit=1)
    return runs[0].status if runs else None


def _launch(defs: dg.Definitions, instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def(request.job_name)
    return job.execute_in_process(instance=instance, tags=request.tags, raise_on_error=False)


def test_datasets_run_one_after_the_other_in_catalog_order(
    demo_specs: list[DatasetSpec], instance: dg.DagsterInstance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    first, second = demo_specs
    server = FakeOpenAI(Faults())
    monkeypatch.setenv("EAGLE_DATA_BASE_URL", server.start())
    monkeypatch.setenv("EAGLE_TEST_KEY", "k")
    monkeypatch.setenv("EAGLE_DATA_ENGINE", "openai")  # the code location's engine: its pool holds generation
    monkeypatch.delenv("EAGLE_DATA_POOL", raising=False)  # ... named after it
    defs = dg.Definitions(
        assets=[asset for spec in demo_specs for asset in build_dataset_assets(spec)],
        asset_checks=build_checks(demo_specs),
        sensors=[catalog_order_sensor(demo_specs)],
        resources={**shard_resources(StorageResource(root=str(tmp_path / "out"))),
                   "engine": EngineResource(kind="openai", model="m", api_key_env="EAGLE_TEST_KEY")},
    )  # fmt: skip
    try:
        _walk(defs, instance, server, (first, second), ShardStore(str(tmp_path / "out")))
    finally:
        server.stop()


def _walk(defs: dg.Definitions, instance: dg.DagsterInstance, server: FakeOpenAI,
          specs: tuple[DatasetSpec, DatasetSpec], store: ShardStore) -> None:  # fmt: skip
    first, second = specs
    assert defs.get_sensor_def("catalog_order").default_status == dg.DefaultSensorStatus.STOPPED

    tick = _tick(defs, instance, None)
    [request] = tick.run_requests
    assert request.tags[ORDER_TAG] == first.name
    assert (request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]) == (
        first.partition_keys[0], first.partition_keys[-1])  # fmt: skip
    assert _tick(defs, instance, tick.cursor).run_requests == []  # its run does not exist yet: nothing else starts

    results: list[dg.ExecuteInProcessResult] = []
    server.faults.latency_s = 3.0  # the first run stays in progress while the sensor ticks
    worker = threading.Thread(target=lambda: results.append(_launch(defs, instance, request)))
    worker.start()
    deadline = time.monotonic() + 120
    while _status(instance, first.name) != dg.DagsterRunStatus.STARTED:
        assert time.monotonic() < deadline, "the first dataset's run never started"
        time.sleep(0.2)
    waiting = _tick(defs, instance, tick.cursor)
    server.faults.latency_s = 0.0
    worker.join()
    assert waiting.run_requests == [] and f"{first.name}: run" in (waiting.skip_message or "")
    [done] = results
    assert done.success
    [canary] = [e for e in done.get_asset_check_evaluations() if e.check_name == CANARY]  # canaried first
    assert canary.passed and canary.metadata["canary_sample"].value > 0
    assert all(store.shard_exists(first.name, first.name, key) for key in first.partition_keys)
    assert "openai" in instance.event_log_storage.get_concurrency_keys()  # generation claimed its pool's slot
    assert defs.get_assets_def(dg.AssetKey(first.name)).op.pool == "openai"

    tick = _tick(defs, instance, tick.cursor)
    [request] = tick.run_requests
    assert request.tags[ORDER_TAG] == second.name
    blocked = _launch(defs, instance, request)
    assert not blocked.success  # the projection exceeds the budget: the blocking check stops generation
    [budget] = [e for e in blocked.get_asset_check_evaluations() if e.check_name == WITHIN_BUDGET]
    assert not budget.passed and "exceed token_budget 1,000" in (budget.description or "")
    [stopped] = [e for e in blocked.all_events if e.is_step_failure]  # the estimate, on its blocking check
    assert stopped.step_key == f"{second.name}_estimate" and WITHIN_BUDGET in stopped.step_failure_data.error.message
    started = {e.step_key for e in blocked.all_events if e.event_type == dg.DagsterEventType.STEP_START}
    assert second.name not in started  # Dagster skipped generation: not one request
    assert not any(store.shard_exists(second.name, second.name, key) for key in second.partition_keys)

    last = _tick(defs, instance, tick.cursor)  # a run stopped at its budget has ended: the walk is over
    assert last.run_requests == [] and "every dataset" in (last.skip_message or "")


@pytest.mark.parametrize(
    ("status", "failed_checks", "waits"),
    [
        (dg.DagsterRunStatus.STARTED, [], "is STARTED; the next dataset waits"),
        (dg.DagsterRunStatus.SUCCESS, [], None),
        (dg.DagsterRunStatus.FAILURE, [WITHIN_BUDGET], None),  # at its budget: as done as it gets
        (dg.DagsterRunStatus.FAILURE, [CANARY], None),  # its sample failed the gates: a person looks at it
        (dg.DagsterRunStatus.FAILURE, ["decontamination"], None),  # a quality gate: a person looks at it
        (dg.DagsterRunStatus.FAILURE, ["failed_rate"], "failed on failed_rate"),  # a re-execution fixes it
        (dg.DagsterRunStatus.FAILURE, ["empty_response", "failed_rate"], "failed on failed_rate"),
        (dg.DagsterRunStatus.FAILURE, [], "FAILURE; re-execute it to go on"),  # an error, not a check
    ],
)
def test_the_walk_moves_on_only_from_a_run_that_is_as_done_as_it_gets(
    status: dg.DagsterRunStatus, failed_checks: list[str], waits: str | None
):
    """A shard whose requests mostly failed is not done: the walk stops on it instead of moving on."""
    run = dg.DagsterRun(job_name="b3_magicoder_run", run_id="r1", status=status)
    why = waits_on("b3_magicoder", run, failed_checks)
    if waits is None:
        assert why is None
    else:
        assert why is not None and why.startswith("b3_magicoder: run r1 ") and waits in why


def test_definitions_load_when_datasets_have_different_partition_counts():
    from eagle_data.definitions import build_definitions

    specs = catalog()
    grown = {**specs, "b7_sharegpt": specs["b7_sharegpt"].model_copy(update={"max_prompts": 1800 * 500})}
    repo = build_definitions(list(grown.values())).get_repository_def()
    assert len(repo.get_job("b7_sharegpt_run").partitions_def.get_partition_keys()) == 1800
    assert {t.job_name for t in repo.get_sensor_def("catalog_order").targets} >= {"b7_sharegpt_run", "b3_magicoder_run"}
