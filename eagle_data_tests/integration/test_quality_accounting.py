"""Token accounting, the never-keep-empty rule, one validation per shard on every core, bounded metadata.

The regression of issue #10 case 1: a server whose model emitted only special tokens (stripped from the
text) answers content "", no reasoning, finish_reason "length" and completion_tokens = max_tokens. Old
validation kept every such row as "truncated" with a loss-mask sum of 0 and `empty_response` passed with
"no completed rows to check"; now each row is `lost_text`, and two blocking checks stop the exports.
Everything runs the real validation stage (real Qwen3 vocabulary) and, where named, a real Dagster instance.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from eagle_data import layout
from eagle_data.catalog import Adapter, DatasetSpec
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.checks import build_checks
from eagle_data.defs.exports import build_exports
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.quality import ShardRecord
from eagle_data.report import SHARD_TABLE_ROWS
from eagle_data.storage import ShardStore
from eagle_data.targets import load_target
from eagle_data_tests import fixtures_stages as stage
from eagle_data_tests.fixtures_quality import generation_frame

MAX_TOKENS = 64


def spec_for(name: str, shard_size: int = 20) -> DatasetSpec:
    return DatasetSpec(
        name=name, title=name, adapter=Adapter(prompt_field="q", response_field="r"), max_prompts=shard_size * 6,
        shard_size=shard_size, target="qwen3-test",
    )  # fmt: skip


def stripped_replies(n: int, dataset: str) -> pl.DataFrame:
    """Every reply as a special-token-stripping server returns it: nothing but the reported count."""
    frame = generation_frame(n, empty_share=0.0, dataset=dataset)
    messages = frame["messages"].to_list()
    for turns in messages:
        turns[-1].update(content="", reasoning="")
    return frame.with_columns(
        status=pl.lit("truncated"),
        finish_reason=pl.lit("length"),
        content=pl.lit(""),
        reasoning=pl.lit(""),
        completion_tokens=pl.lit(MAX_TOKENS, pl.Int64),
        messages=pl.Series(messages, dtype=frame.schema["messages"]),
    )


def test_stripped_replies_are_lost_text_and_none_is_kept(tmp_path: Path) -> None:
    spec, store = spec_for("b9_strip"), ShardStore(str(tmp_path))
    store.write_shard(spec.name, spec.name, "00000", stripped_replies(20, spec.name))
    records = stage.validate(spec, store, ["00000"], workers=1).records
    rows = store.read_shard(spec.name, layout.validated_asset(spec.name), "00000")
    assert rows["verdict"].unique().to_list() == ["lost_text"]
    # reported 64; rebuilt 2 (the think block the template opens: "<think>", "\n"); 4 tokens of slack
    assert rows["lost_tokens"].unique().to_list() == [MAX_TOKENS - 2 - 4]
    assert rows["token_ratio"].unique().to_list() == [2 / MAX_TOKENS]
    results = {r.name: r for r in records["00000"].results}
    assert not results["lost_text"].passed and results["lost_text"].blocking
    assert results["lost_text"].message.startswith("100.0% of 20 replies lost text")
    assert not results["empty_response"].passed  # each row counted once: as lost_text, not also as a short reply
    assert results["empty_response"].message.startswith("the shard keeps no training row (lost_text 20)")


def test_healthy_replies_account_for_what_the_engine_reported(tmp_path: Path) -> None:
    """Reported = the reply's own tokens (+ the stop token): no row is lost, the ratio sits near 1."""
    spec, store = spec_for("b9_healthy"), ShardStore(str(tmp_path))
    frame = generation_frame(20, empty_share=0.0, dataset=spec.name)
    target = load_target(spec.target).text_encoder
    counts = [
        len(target.encode(f"<think>\n{r}\n</think>\n\n{c}", add_special_tokens=False).ids) + 1
        for r, c in zip(frame["reasoning"], frame["content"], strict=True)
    ]
    store.write_shard(spec.name, spec.name, "00000", frame.with_columns(completion_tokens=pl.Series(counts)))
    records = stage.validate(spec, store, ["00000"], workers=1).records
    rows = store.read_shard(spec.name, layout.validated_asset(spec.name), "00000")
    assert rows["verdict"].unique().to_list() == ["pass"]
    assert rows["token_ratio"].min() == pytest.approx(1.0, abs=0.02)
    record = records["00000"]
    assert record.numbers["token_ratio"] == pytest.approx(1.0, abs=0.01) and record.numbers["lost_text_share"] == 0
    assert dict(record.ratio_hist)["100–104"] + dict(record.ratio_hist)["95–99"] == 20


def test_the_special_token_regression_fails_blocking_checks_and_stops_the_training_mix(tmp_path: Path) -> None:
    """Issue #10 case 1 through the real `{ds}_validated`, its asset checks and `training_mix`."""
    spec = spec_for("b9_strip")
    ShardStore(str(tmp_path)).write_shard(spec.name, spec.name, "00000", stripped_replies(20, spec.name))
    checks = build_checks([spec])
    defs = dg.Definitions(
        assets=[*build_dataset_assets(spec), build_exports([spec], checks)],
        asset_checks=checks,
        resources={**shard_resources(StorageResource(root=str(tmp_path))), "engine": EngineResource()},
    )
    selection = {dg.AssetKey(layout.validated_asset(spec.name)), dg.AssetKey("training_mix")}
    with dg.instance_for_test() as instance:
        job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=selection)
        result = job.execute_in_process(partition_key="00000", instance=instance, raise_on_error=False)
        assert instance.get_latest_materialization_event(dg.AssetKey("training_mix")) is None
    assert not result.success
    failed = {e.check_name: e for e in result.get_asset_check_evaluations() if not e.passed}
    assert set(failed) == {"empty_response", "lost_text"}  # the cut replies are lost_text, not also truncation
    assert failed["lost_text"].blocking and failed["empty_response"].blocking
    assert failed["lost_text"].metadata["figure"].value == 1.0


def _validated_bytes(store: ShardStore, spec: DatasetSpec, keys: list[str]) -> list[pl.DataFrame | bytes]:
    out: list[pl.DataFrame | bytes] = []
    for key in keys:
        out.append(store.read_shard(spec.name, layout.validated_asset(spec.name), key))
        out.append(store.read_bytes(layout.quality_record(spec.name, key)))
    return out


def test_one_worker_and_two_workers_write_the_same_ids_masks_verdicts_and_records(tmp_path: Path) -> None:
    spec, keys = spec_for("b9_pool"), ["00000", "00001", "00002"]
    stores = {n: ShardStore(str(tmp_path / f"w{n}")) for n in (1, 2)}
    for store in stores.values():
        for i, key in enumerate(keys):
            store.write_shard(spec.name, spec.name, key, generation_frame(20, empty_share=0.1 * i, dataset=key))
    records = {n: stage.validate(spec, store, keys, workers=n).records for n, store in stores.items()}
    assert records[1] == records[2]
    one, two = (_validated_bytes(stores[n], spec, keys) for n in (1, 2))
    for a, b in zip(one, two, strict=True):
        assert a.equals(b) if isinstance(a, pl.DataFrame) else a == b
    assert ShardRecord.from_json(one[1]) == records[1]["00000"]  # type: ignore[arg-type]


SHARD_TABLE = "dataset_shard_table"


def _event_sizes(defs: dg.Definitions, spec: DatasetSpec, keys: list[str]) -> list[int]:
    """JSON size of each validated partition's materialization metadata after one range run over `keys`."""
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    asset = dg.AssetKey(layout.validated_asset(spec.name))
    with dg.instance_for_test() as instance:
        job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={asset})
        assert job.execute_in_process(instance=instance, tags=tags).success
        events = instance.fetch_materializations(asset, limit=100).records
        assert sorted(e.partition_key for e in events) == keys
        sizes = []
        for event in events:
            metadata = dict(event.asset_materialization.metadata)  # type: ignore[union-attr]
            # The worst shards' table grows with the dataset up to its cap, never past it.
            table = str(metadata.pop(SHARD_TABLE, dg.MetadataValue.md("")).value)
            assert table.count("\n| ") <= SHARD_TABLE_ROWS + 1, table  # its rows and the separator line
            sizes.append(len(json.dumps({k: str(v.value) for k, v in metadata.items()})))
    return sizes


def test_event_metadata_does_not_grow_with_the_number_of_partitions_in_the_range(tmp_path: Path) -> None:
    spec = spec_for("b9_meta", shard_size=8)
    shard = generation_frame(8, empty_share=0.0, dataset=spec.name)

    def fresh(root: Path) -> dg.Definitions:
        """A root of its own per run: a shard validated before compares its length with its own earlier figure."""
        for key in spec.partition_keys:
            ShardStore(str(root)).write_shard(spec.name, spec.name, key, shard)  # identical shards and figures
        resources = {**shard_resources(StorageResource(root=str(root))), "engine": EngineResource()}
        return dg.Definitions(assets=build_dataset_assets(spec), resources=resources)

    two = _event_sizes(fresh(tmp_path / "two"), spec, spec.partition_keys[:2])
    six = _event_sizes(fresh(tmp_path / "six"), spec, spec.partition_keys)
    assert len(set(two + six)) == 1, (two, six)
