"""The catalog walk job: one dataset at a time, estimate first, nothing generated twice."""

from pathlib import Path

import dagster as dg
import pytest

from eagle_data import quality
from eagle_data.catalog import catalog
from eagle_data.defs.jobs import walk_catalog
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.storage import ShardStore


@pytest.fixture
def run_walk(tmp_path: Path, demo_model: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    catalog.cache_clear()  # the catalog is read once per process; this test's process switches profile
    instance = dg.DagsterInstance.ephemeral()  # one instance per test: later runs see earlier ones

    def run(**config) -> dg.ExecuteInProcessResult:
        return walk_catalog.execute_in_process(
            run_config={"ops": {"walk_datasets": {"config": config}}},
            resources={
                "storage": StorageResource(root=str(tmp_path / "out")),
                "engine": EngineResource(kind="local", model=str(demo_model)),
            },
            instance=instance,
        )

    yield run
    catalog.cache_clear()


def _events(result: dg.ExecuteInProcessResult, kind: str) -> list[tuple[str, str | None, dict]]:
    return [
        (e.asset_key.to_user_string(), e.partition, e.event_specific_data.materialization.metadata
         if kind == "ASSET_MATERIALIZATION" else e.event_specific_data.asset_observation.metadata)
        for e in result.all_events
        if e.event_type_value == kind
    ]


def test_estimate_only_spends_just_the_sample(run_walk, tmp_path: Path):
    result = run_walk(datasets=["b5_openthoughts"], sample_prompts=4, usd_per_million_completion_tokens=2.0,
                      estimate_only=True)
    assert result.success
    observed = _events(result, "ASSET_OBSERVATION")
    assert [a for a, _, _ in observed] == ["b5_openthoughts"]
    figures = {k: v.value for k, v in observed[0][2].items()}
    assert figures["est_prompts"] == 36 and figures["est_sample_rows"] == 4
    assert figures["est_completion_tokens"] > 0
    assert figures["est_cost_usd"] == pytest.approx(figures["est_completion_tokens"] * 2e-6, abs=1e-4)
    assert {a for a, _, _ in _events(result, "ASSET_MATERIALIZATION")} == {"b5_openthoughts_prompts"}
    store = ShardStore(str(tmp_path / "out"))
    assert not store.shard_exists("b5_openthoughts", "b5_openthoughts", "00000")  # no partial shard file
    assert len(store.list("b5_openthoughts/b5_openthoughts/_log/00000")) >= 1  # the sample is kept for reuse


def test_walk_materializes_every_partition_and_reuses_the_sample(run_walk):
    result = run_walk(datasets=["b3_magicoder"], sample_prompts=5)
    assert result.success
    done = _events(result, "ASSET_MATERIALIZATION")
    for asset in ("b3_magicoder_prompts", "b3_magicoder", "b3_magicoder_validated"):
        assert sorted(p for a, p, _ in done if a == asset) == ["00000", "00001", "00002", "00003"]
    generation = {p: meta for a, p, meta in done if a == "b3_magicoder"}
    assert [generation[p]["total"].value for p in sorted(generation)] == [10, 10, 10, 6]  # each shard's own
    assert generation["00000"]["reused"].value == 5  # the estimate's sample, not paid twice
    assert sum(generation[p]["reused"].value for p in generation) == 5
    assert sum(generation[p]["ok"].value + generation[p]["truncated"].value for p in generation) == 36
    validated = {p: meta for a, p, meta in done if a == "b3_magicoder_validated"}
    assert [validated[p]["rows"].value for p in sorted(validated)] == [10, 10, 10, 6]
    checked = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert len(checked) == 4 * len(quality.CHECKS)  # every gate on every shard, as the asset checks would
    assert {c.check_name for c in checked} == {d.name for d in quality.CHECKS}

    again = run_walk(datasets=["b3_magicoder"], sample_prompts=5)  # everything reused; compared with the last
    shifts = [
        e.event_specific_data
        for e in again.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION" and e.event_specific_data.check_name == "length_shift"
    ]
    previous = {meta["avg_completion_tokens"].value for a, _, meta in done if a == "b3_magicoder_validated"}
    assert len(shifts) == 4 and all(s.passed for s in shifts)  # same replies: no shift
    assert {s.metadata["previous_avg_completion_tokens"].value for s in shifts} <= previous


def test_unknown_dataset_in_the_walk_is_a_clear_error(run_walk):
    with pytest.raises(Exception, match="unknown dataset 'b0_nothing'"):
        run_walk(datasets=["b0_nothing"])
