"""What the Dagster UI shows of a dataset's assets besides our own figures: Dagster's `dagster/row_count`
and `dagster/column_schema` per materialized partition, and code versions that follow the settings."""

import json
import logging
from pathlib import Path

import dagster as dg
import pytest

from eagle_data.catalog import Adapter, DatasetSpec
from eagle_data.defs.assets import COLUMN_SCHEMA, VALIDATED_COLUMNS, add_row_counts, build_dataset_assets
from eagle_data.defs.checks import build_checks
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.messages import file_locations, leveled, uri_locations
from eagle_data.defs.metadata import ROW_COUNT
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.stage_table import stage
from eagle_data.storage import ShardStore
from eagle_data_tests.fixtures_quality import generation_frame

SPEC = DatasetSpec(
    name="b9_meta", title="Meta", adapter=Adapter(prompt_field="q", response_field="r"), max_prompts=400,
    shard_size=200, target="qwen3-test",
)  # fmt: skip


def latest(instance: dg.DagsterInstance, asset: str, partition: str) -> dict[str, dg.MetadataValue]:
    page = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1
    )
    materialization = page.records[0].asset_materialization
    assert materialization is not None
    return dict(materialization.metadata)


def test_row_count_and_column_schema_are_read_back_from_the_instance(tmp_path: Path) -> None:
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps({"q": f"question number {i}?", "r": "a"}) + "\n" for i in range(330)))
    ShardStore(str(tmp_path)).write_shard(SPEC.name, SPEC.name, "00001", generation_frame(150, 0.0, SPEC.name))
    defs = dg.Definitions(
        assets=build_dataset_assets(SPEC),
        asset_checks=build_checks([SPEC]),
        resources={**shard_resources(StorageResource(root=str(tmp_path))), "engine": EngineResource()},
    )
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={dg.AssetKey("b9_meta_prompts"), dg.AssetKey("b9_meta_validated")}
    )
    tags = {"dagster/asset_partition_range_start": "00000", "dagster/asset_partition_range_end": "00001"}
    config = {"ops": {"b9_meta_prompts": {"config": {"source_path": str(source)}}}}
    with dg.instance_for_test() as instance:
        ShardStore(str(tmp_path)).write_shard(SPEC.name, SPEC.name, "00000", generation_frame(200, 0.0, SPEC.name))
        result = job.execute_in_process(instance=instance, tags=tags, run_config=config, raise_on_error=False)
        assert result.success
        prompts = {key: latest(instance, "b9_meta_prompts", key) for key in ("00000", "00001")}
        validated = {key: latest(instance, "b9_meta_validated", key) for key in ("00000", "00001")}
    assert [prompts[k][ROW_COUNT].value for k in ("00000", "00001")] == [330, 330]  # the dataset's 330 prompts
    assert [prompts[k]["rows"].value for k in ("00000", "00001")] == [200, 130]  # in shards of 200
    # The asset page's "Row count" is the dataset's (every judged shard); each shard's own is its `rows` figure.
    assert [validated[k][ROW_COUNT].value for k in ("00000", "00001")] == [350, 350]
    assert [validated[k]["rows"].value for k in ("00000", "00001")] == [200, 150]
    prompt_columns = {c.name: c.type for c in prompts["00001"][COLUMN_SCHEMA].value.columns}
    assert list(prompt_columns)[:3] == ["prompt_id", "dataset", "shard"] and "messages" in prompt_columns
    # The validated page opens on its summary and the report, not on a Columns section of one row per column.
    assert list(validated["00001"])[:2] == ["summary", "quality_report"] and COLUMN_SCHEMA not in validated["00001"]
    assert "rows kept for training" in validated["00001"]["summary"].value
    validated_columns = {c.name: c.type for c in validated["00001"][VALIDATED_COLUMNS].value.columns}
    assert validated_columns["input_ids"] == "List(Int32)" and validated_columns["loss_mask"] == "List(UInt8)"
    assert {"prompt_id", "num_tokens", "loss_tokens", "verdict"} <= set(validated_columns)
    report = validated["00001"]["quality_report"]  # a path to copy: a browser refuses file:// from a web page
    assert (
        report.value == f"{tmp_path}/b9_meta/b9_meta_quality/index.html"
        and "quality_report_link" not in validated["00001"]
    )
    assert validated["00001"]["dataset_shards"].value == 2 and validated["00001"]["dataset_rows"].value == 350
    assert "| empty_response | pass |" in validated["00001"]["dataset_checks"].value
    share = validated["00001"]["dataset_pass_share"].value  # rounded as a person reads it, like each shard's
    assert share == round(share, 4) and all(v["pass_share"].value == round(v["pass_share"].value, 4)
                                            for v in validated.values())  # fmt: skip
    shards = validated["00001"]["dataset_shard_table"].value  # the page's per-shard table, on the asset page
    assert shards.startswith("| shard | rows | train_rows |")
    assert "| 00000 | 200 |" in shards and "| 00001 | 150 |" in shards


def test_code_versions_follow_the_settings_each_stage_reads() -> None:
    stricter = SPEC.model_copy(update={"checks": SPEC.checks.model_copy(update={"max_short_share": 0.0})})
    assert stage("validated").version(stricter) != stage("validated").version(SPEC)
    assert stage("prompts").version(stricter) == stage("prompts").version(SPEC)
    assert stage("generation").version(stricter) == stage("generation").version(SPEC)
    versions = {
        key.path[-1]: version
        for asset in build_dataset_assets(SPEC)
        for key, version in asset.code_versions_by_key.items()
    }
    assert versions["b9_meta_validated"] == stage("validated").version(SPEC)
    assert versions["b9_meta"] == stage("generation").version(SPEC)
    assert versions["b9_meta_estimate"] == stage("estimate").version(SPEC)
    budget = SPEC.model_copy(update={"token_budget": 1_000})
    assert stage("estimate").version(budget) != stage("estimate").version(SPEC)


def test_the_mix_and_the_drafter_inputs_carry_code_versions_that_follow_their_settings() -> None:
    from eagle_data.defs.drafter import build_drafter_assets
    from eagle_data.defs.exports import build_exports

    def versions(spec: DatasetSpec) -> dict[str, str | None]:
        assets = [build_exports([spec], []), *build_drafter_assets([spec])]
        return {k.path[-1]: v for a in assets for k, v in a.code_versions_by_key.items()}

    base, heavier = versions(SPEC), versions(SPEC.model_copy(update={"mix_weight": 2.0}))
    assert set(base) == {"training_mix", "draft_vocab", "hidden_state_plan", "hidden_states"}
    assert all(base.values()) and heavier["training_mix"] != base["training_mix"]
    drafter = [k for k in base if k != "training_mix"]
    assert [heavier[k] for k in drafter] == [base[k] for k in drafter]  # they read the drafter settings only


def test_a_user_error_fails_the_step_with_its_one_line_not_a_class_path(tmp_path: Path) -> None:
    """A source file that is not there: the step's error is the source's own line, as a Failure."""
    prompts = build_dataset_assets(SPEC)[0]
    config = {"ops": {"b9_meta_prompts": {"config": {"source_path": str(tmp_path / "nowhere.jsonl")}}}}
    result = dg.materialize(
        [prompts], partition_key="00000", run_config=config, raise_on_error=False,
        resources={**shard_resources(StorageResource(root=str(tmp_path)))},
    )  # fmt: skip
    error = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert error.cls_name == "Failure" and error.cause is None
    assert error.message.startswith("dagster._core.definitions.events.Failure: ")  # what alerts.readable strips
    assert "nowhere.jsonl" in error.message and "SourceError" not in error.to_string()


def test_a_pipeline_warning_reaches_dagster_at_warning_level(caplog: pytest.LogCaptureFixture) -> None:
    """The export's "WARNING b7 shard 00001 left out of the export: ..." used to be logged at INFO."""
    logger = logging.getLogger("eagle_data_tests.leveled")
    with caplog.at_level(logging.INFO, logger=logger.name):
        line = leveled(logger)
        line("WARNING b7_sharegpt shard 00001 left out of the export: empty_response failed")
        line("b7_sharegpt: wrote 10 prompts")
    assert [(r.levelname, r.getMessage().split(" ")[0]) for r in caplog.records] == [
        ("WARNING", "WARNING"), ("INFO", "b7_sharegpt:")
    ]  # fmt: skip


def test_written_files_are_copyable_paths_and_with_the_files_server_also_links(
    store: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "b9_meta/b9_meta_quality/index.html"
    store.write_bytes(key, b"<html></html>")
    monkeypatch.delenv("EAGLE_DATA_FILES_URL", raising=False)
    found = file_locations(store, {"quality_report": key})
    assert found == {"quality_report": dg.MetadataValue.path(store.uri(key))}
    monkeypatch.setenv("EAGLE_DATA_FILES_URL", "http://127.0.0.1:3001")
    found = file_locations(store, {"quality_report": key})
    assert found["quality_report_link"] == dg.MetadataValue.url(f"http://127.0.0.1:3001/{key}")  # never signed
    assert uri_locations(store, {"mix_path": store.uri("mix/mix.parquet"), "rows": 3}) == file_locations(
        store, {"mix_path": "mix/mix.parquet"}
    )


SHARD_ROWS = {"00000": 10, "00001": 10, "00002": 10, "00003": 6}  # 36 rows in 4 shards, as the demo's b7


@dg.asset(partitions_def=dg.StaticPartitionsDefinition(list(SHARD_ROWS)))
def shards(context: dg.AssetExecutionContext) -> None:
    """Writes its partitions' row counts as the dataset assets do."""
    add_row_counts(context, {key: SHARD_ROWS[key] for key in context.partition_keys})


def test_the_row_count_dagster_shows_is_the_datasets_over_every_run() -> None:
    """Dagster's "Row count" is the latest materialization's `dagster/row_count`, whichever partition: each
    partition carries the dataset's rows over every shard (earlier runs' included), its own in `rows`."""
    shard_rows = SHARD_ROWS
    with dg.instance_for_test() as instance:
        assert dg.materialize([shards], instance=instance, partition_key="00000").success
        assert latest(instance, "shards", "00000")[ROW_COUNT].value == 10
        tags = {"dagster/asset_partition_range_start": "00001", "dagster/asset_partition_range_end": "00003"}
        assert dg.materialize([shards], instance=instance, tags=tags).success
        assert dg.materialize([shards], instance=instance, partition_key="00001").success  # a rerun counts once
        newest = instance.get_latest_materialization_event(dg.AssetKey("shards"))
        assert newest is not None and newest.asset_materialization is not None
        assert newest.asset_materialization.metadata[ROW_COUNT].value == 36  # 10 before the change
        assert [latest(instance, "shards", k)["rows"].value for k in shard_rows] == [10, 10, 10, 6]
        assert latest(instance, "shards", "00003")[ROW_COUNT].value == 36
