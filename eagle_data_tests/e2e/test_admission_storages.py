"""The export's gate over run sequences, on the two storages a deployment uses: SQLite (the repository's
dagster.yaml: one event-log file per run beside the index) and PostgreSQL (one database).

Regression for issue #18: after a second range run, every shard was left out ("last ran on an earlier
materialization"), because the gate compared an evaluation's storage id (on SQLite, numbered in its run's
own file) with a materialization's (numbered in the index). Each test asserts the exact rows exported,
counted from the shards it expects admitted with the export's own row filter.
"""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from eagle_data import exports, layout
from eagle_data.alerts import WEBHOOK_ENV
from eagle_data.catalog import load_catalog
from eagle_data.defs.checks import check_keys
from eagle_data.defs.sensors import build_sensors
from eagle_data.stages import validation
from eagle_data.standins.webhook import Receiver
from eagle_data.storage import ShardStore
from eagle_data.storage.shards import StoredShards
from eagle_data_tests.conftest import materialize_cli
from eagle_data_tests.fixtures_postgres import postgres_storage
from eagle_data_tests.fixtures_quality import generation_frame
from eagle_data_tests.integration.test_exports_defs import definitions, run, shard_frame, spec
from eagle_data_tests.integration.test_quality_defs import tick

REPO = Path(__file__).resolve().parents[2]
KEYS = ("00000", "00001", "00002")
RANGE = {"dagster/asset_partition_range_start": KEYS[0], "dagster/asset_partition_range_end": KEYS[-1]}


@pytest.fixture(params=["sqlite", "postgres"])
def instance(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """A fresh instance with the repository's dagster.yaml: on SQLite files under its home (Dagster's
    default storage, which that file keeps), or with PostgreSQL storage."""
    overrides = yaml.safe_load((REPO / "dagster.yaml").read_text())
    if request.param == "postgres":
        overrides["storage"] = postgres_storage(request.getfixturevalue("pg_database"))
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home"), overrides=overrides) as instance:
        yield instance


class Dataset:
    """b9_seq: three shards written to storage, and its definitions (assets, checks, export)."""

    def __init__(self, root: Path) -> None:
        self.spec, self.root, self.store = spec("b9_seq", len(KEYS)), root, ShardStore(str(root))
        self.defs = definitions(self.spec, root)
        for key in KEYS:
            self.generate(key, 0.0)

    def generate(self, key: str, empty_share: float) -> None:
        """Write the generation shard `key`, with a share of empty replies."""
        self.store.write_shard(self.spec.name, self.spec.name, key, shard_frame(self.spec.name, key, empty_share))

    def range_run(self, instance: dg.DagsterInstance, *assets: str) -> dg.ExecuteInProcessResult:
        """One run over every partition (a single-run backfill), with the checks."""
        job = self.defs.resolve_implicit_global_asset_job_def()
        selection = {dg.AssetKey(a) for a in (f"{self.spec.name}_validated", *assets)}
        return job.get_subset(asset_selection=selection).execute_in_process(
            instance=instance, tags=RANGE, raise_on_error=False
        )

    def rerun(self, instance: dg.DagsterInstance) -> None:
        """The dataset run twice over its whole range, as issue #18 found it: the sequences start here."""
        assert self.range_run(instance).success and self.range_run(instance).success

    def rows(self, keys: tuple[str, ...]) -> int:
        """Training rows the export takes from the validated shards `keys`, as they are now."""
        shards = (self.store.read_shard(self.spec.name, f"{self.spec.name}_validated", k) for k in keys)
        return sum(exports.exportable(shard, self.spec)[0].height for shard in shards)

    def exported(self) -> pl.DataFrame:
        return pl.read_parquet(self.root / layout.export_file(self.spec.name, layout.TRAIN_FILE))


def excluded(result: dg.ExecuteInProcessResult) -> str:
    metadata = result.asset_materializations_for_node("training_mix")[0].metadata
    return metadata["excluded"].value if "excluded" in metadata else ""


def test_a_second_range_run_keeps_every_shard_in_the_export(instance: dg.DagsterInstance, tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    ds.rerun(instance)
    result = run(instance, ds.defs, "training_mix")
    assert result.success, excluded(result)
    assert ds.exported().height == ds.rows(KEYS) > 0 and excluded(result) == ""


def test_a_single_partition_run_after_range_runs(instance: dg.DagsterInstance, tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    ds.rerun(instance)
    assert run(instance, ds.defs, "b9_seq_validated", "00001").success
    result = run(instance, ds.defs, "training_mix")
    assert result.success and excluded(result) == ""
    assert ds.exported().height == ds.rows(KEYS)


def test_execute_all_after_range_runs(instance: dg.DagsterInstance, tmp_path: Path) -> None:
    """The Checks tab's "Execute all": a checks-only run without a partition judges every shard again."""
    ds = Dataset(tmp_path)
    ds.rerun(instance)
    job = ds.defs.resolve_implicit_global_asset_job_def()
    checks_only = job.get_subset(asset_selection=set(), asset_check_selection=set(check_keys(ds.spec)))
    assert checks_only.execute_in_process(instance=instance).success
    result = run(instance, ds.defs, "training_mix")
    assert result.success and excluded(result) == ""
    assert ds.exported().height == ds.rows(KEYS)


def test_a_later_failing_run_leaves_out_that_shard_alone(instance: dg.DagsterInstance, tmp_path: Path) -> None:
    ds = Dataset(tmp_path)
    ds.rerun(instance)
    ds.generate("00001", 0.87)
    failed = run(instance, ds.defs, "b9_seq_validated", "00001")
    assert not failed.success
    result = run(instance, ds.defs, "training_mix")
    assert result.success
    assert ds.exported().height == ds.rows(("00000", "00002"))
    table = excluded(result)
    assert f"| b9_seq | 00001 | empty_response failed in run {failed.run_id[:8]}: " in table
    assert "00000" not in table and "00002" not in table


def test_a_shard_rewritten_after_its_checks_is_left_out(instance: dg.DagsterInstance, tmp_path: Path) -> None:
    """A validation run that stopped part-way recorded shard 00002's new bytes and never stored them."""
    ds = Dataset(tmp_path)
    ds.rerun(instance)
    ds.store.write_shard(ds.spec.name, ds.spec.name, "00002", shard_frame(ds.spec.name, "00002", 0.0).head(40))
    generations = StoredShards(ds.store, ds.spec.name, ds.spec.name, ["00002"])
    validation.validate(ds.spec, ds.store, generations, log=lambda _: None)  # records written, no shard stored
    result = run(instance, ds.defs, "training_mix")
    assert result.success
    assert ds.exported().height == ds.rows(("00000", "00001"))
    assert "| b9_seq | 00002 | its bytes changed since its checks ran" in excluded(result)


def test_a_range_run_with_the_export_runs_it_only_when_the_blocking_checks_pass(
    instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    ds = Dataset(tmp_path)
    passed = ds.range_run(instance, "training_mix")
    assert passed.success and passed.asset_materializations_for_node("training_mix")
    assert ds.exported().height == ds.rows(KEYS)
    ds.generate("00001", 0.87)
    failed = ds.range_run(instance, "training_mix")
    assert not failed.success
    assert not [e for e in failed.all_events if e.step_key == "training_mix" and e.is_step_start]
    failure = next(e for e in failed.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = failure.step_failure_data.user_failure_data.description
    assert message == (
        "b9_seq_validated: blocking check(s) failed: empty_response on 00001; see each shard's evaluation"
    )


CHECK_STATUSES = """
query Checks($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks { name partitionStatuses {
      ... on AssetCheckDefaultPartitionStatuses {
        succeededPartitions failedPartitions skippedPartitions inProgressPartitions executionFailedPartitions
      }
    } } } } }
  }
}
"""


def test_after_a_range_run_the_checks_tab_shows_each_shard_passed(instance: dg.DagsterInstance, tmp_path: Path) -> None:
    """Through the GraphQL the UI's Checks tab reads (`partitionStatuses`, the query in the webserver's
    bundle): a range run used to leave every shard's row planned, which the UI shows as "Skipped"."""
    from dagster._core.test_utils import in_process_test_workspace
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster_graphql.test.utils import execute_dagster_graphql

    ds = Dataset(tmp_path / "out")
    ds.generate("00001", 0.87)
    assert not ds.range_run(instance).success  # 00001 fails empty_response
    module = tmp_path / "ui_defs.py"
    module.write_text(
        "from pathlib import Path\n"
        "from eagle_data_tests.integration.test_exports_defs import definitions, spec\n"
        f"defs = definitions(spec('b9_seq', 3), Path({str(ds.root)!r}))\n"
    )
    with in_process_test_workspace(instance, LoadableTargetOrigin(python_file=str(module))) as context:
        result = execute_dagster_graphql(context, CHECK_STATUSES, {"key": {"path": ["b9_seq_validated"]}})
    checks = result.data["assetNodeOrError"]["assetChecksOrError"]["checks"]
    statuses = {c["name"]: {k: sorted(v) for k, v in c["partitionStatuses"].items()} for c in checks}
    assert len(statuses) == 8
    nothing = {"skippedPartitions": [], "inProgressPartitions": [], "executionFailedPartitions": []}
    assert (
        statuses["empty_response"]
        == {"succeededPartitions": ["00000", "00002"], "failedPartitions": ["00001"]} | nothing
    )
    assert statuses["token_structure"] == {"succeededPartitions": list(KEYS), "failedPartitions": []} | nothing


def test_the_demo_range_run_twice_then_the_export_takes_every_shard(demo_model: Path, tmp_path: Path) -> None:
    """Issue #18 as reported, through the CLI with the repository's dagster.yaml (SQLite under
    $DAGSTER_HOME): the demo dataset's range run twice, then `training_mix`. The replies are written
    beforehand (generating them with the demo model takes minutes), so the runs validate and check."""
    home, root = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(home), EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(root),
               EAGLE_DATA_DEMO_MODEL=str(demo_model))  # fmt: skip
    store, spec = ShardStore(str(root)), load_catalog(profile="demo")["b7_sharegpt"]
    keys = spec.partition_keys
    for key in keys:  # token counts as reported by an engine whose tokenizer is not the demo target's: low
        replies = generation_frame(
            spec.shard_size, empty_share=0.0, dataset=spec.name, thinking=spec.generation.thinking
        )
        replies = replies.with_columns(  # the demo model served them: target "auto" is derived from its checkpoint
            pl.lit(1, replies.schema["completion_tokens"]).alias("completion_tokens"), model=pl.lit(str(demo_model))
        )
        store.write_shard(
            spec.name, spec.name, key, replies.with_columns(prompt_id=pl.lit(f"{key}-") + pl.col("prompt_id"))
        )
    ranged = ["--select", f"{spec.name}_validated", "--partition-range", f"{keys[0]}...{keys[-1]}"]
    for command in (ranged, ranged, ["--select", "training_mix"]):
        out = materialize_cli(env, *command, timeout_s=300)
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    validated = [store.read_shard(spec.name, f"{spec.name}_validated", k) for k in keys]
    expected = sum(exports.exportable(shard, spec)[0].height for shard in validated)
    assert len(keys) > 1 and expected > 0
    assert pl.read_parquet(root / layout.export_file(spec.name, layout.TRAIN_FILE)).height == expected


def test_a_range_run_failing_on_two_shards_is_announced_once_naming_both(
    instance: dg.DagsterInstance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluations are per shard; the alert stays one per run and check, and names the failing shards."""
    ds = Dataset(tmp_path)
    defs = dg.Definitions(
        assets=ds.defs.assets, asset_checks=ds.defs.asset_checks, sensors=build_sensors([ds.spec]),
        resources=ds.defs.resources,
    )  # fmt: skip
    ds.generate("00000", 0.87)
    ds.generate("00002", 0.87)
    with Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        cursor = tick(defs, instance, "quality_alerts", None).cursor
        assert not ds.range_run(instance).success
        tick(defs, instance, "quality_alerts", cursor)
    assert [a["blocks"][0]["text"]["text"] for a in receiver.bodies] == [
        "ERROR check empty_response failed on b9_seq (b9_seq_validated) [00000, 00002]"
    ]
    assert "[00000, 00002]: 88.0% of 50 replies were empty" in receiver.bodies[0]["text"]  # the first shard's line
