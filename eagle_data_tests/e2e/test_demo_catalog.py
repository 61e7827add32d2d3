"""The whole catalog on the demo profile: `catalog_order` walks every dataset and every dataset's run is
green (one shard each, on the random-weight stand-in: the `demo_model` fixture, not the demo's SmolLM2), then
the training mix and drafter inputs are built from them. The stand-in's text is word salad; its data must still
pass the gates. Every metadata name the runs emit is
described in docs/figures.md."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import dagster as dg
import pytest

from eagle_data.catalog import DatasetSpec, catalog
from eagle_data.definitions import build_definitions
from eagle_data.defs.catalog_order import ORDER_TAG

pytestmark = pytest.mark.e2e
GLOSSARY = Path(__file__).resolve().parents[2] / "docs" / "figures.md"
LINK = "_link"  # with the files server, every path figure has a link twin
# Prompts per dataset: the demo's shards hold 10, the canary 8; four go through every stage and gate with
# fewer demo-model generations, which are this test's cost.
PROMPTS = 4


def glossary() -> list[re.Pattern[str]]:
    """The first column of docs/figures.md's tables; `<ds>`-style placeholders stand for any word."""
    names = re.findall(r"^\| `([^`]+)` \|", GLOSSARY.read_text(), flags=re.MULTILINE)
    return [re.compile(re.sub(r"<[a-z]+>", ".+", re.escape(n).replace(r"\<", "<").replace(r"\>", ">"))) for n in names]


def undocumented(names: Iterable[str]) -> list[str]:
    patterns = glossary()
    return sorted(n for n in set(names) if not any(p.fullmatch(n.removesuffix(LINK)) for p in patterns))


def metadata_names(result: dg.ExecuteInProcessResult) -> set[str]:
    names: set[str] = set()
    for event in result.all_events:
        if event.event_type_value == "ASSET_MATERIALIZATION":
            names |= set(event.event_specific_data.materialization.metadata)
        elif event.event_type_value == "ASSET_CHECK_EVALUATION":
            names |= set(event.event_specific_data.metadata)
    return names


def test_the_glossary_reads_placeholders_and_links() -> None:
    assert undocumented(["dagster/row_count", "b7_sharegpt_rows", "mapping_32000_path_link", "coverage_64000"]) == []
    assert undocumented(["rows_per_second", "b7_sharegpt_unknown"]) == ["b7_sharegpt_unknown", "rows_per_second"]


@pytest.fixture
def demo_catalog(monkeypatch: pytest.MonkeyPatch, demo_model: Path, tmp_path: Path) -> Iterator[list[DatasetSpec]]:
    """Every catalog dataset on the demo profile, one shard each of PROMPTS prompts."""
    for name in ("EAGLE_DATA_ENGINE", "EAGLE_DATA_POOL", "EAGLE_DATA_MODEL", "EAGLE_DATA_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model))
    monkeypatch.setenv("EAGLE_DATA_ROOT", str(tmp_path / "out"))
    yield [spec.model_copy(update={"max_prompts": PROMPTS}) for spec in catalog().values()]


def test_catalog_order_on_the_demo_makes_every_dataset_green(demo_catalog: list[DatasetSpec]) -> None:
    defs = build_definitions(demo_catalog)
    sensor, cursor, outcomes, names = defs.resolve_sensor_def("catalog_order"), None, {}, set()
    with dg.instance_for_test() as instance:
        for _ in range(len(demo_catalog) + 1):
            with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs) as context:
                tick = sensor.evaluate_tick(context)
            cursor = tick.cursor
            for request in tick.run_requests or []:
                job = defs.resolve_job_def(request.job_name)
                result = job.execute_in_process(instance=instance, tags=request.tags, raise_on_error=False)
                failed = [
                    f"{e.check_name}: {e.description}" for e in result.get_asset_check_evaluations() if not e.passed
                ]
                outcomes[request.tags[ORDER_TAG]] = "green" if result.success and not failed else failed or "failed"
                names |= metadata_names(result)
        assert json.loads(cursor or "{}").get("index") == len(demo_catalog) - 1
        assert outcomes == {spec.name: "green" for spec in demo_catalog}
        downstream = {dg.AssetKey(name) for name in ("training_mix", "draft_vocab", "hidden_state_plan")}
        result = (
            defs.resolve_implicit_global_asset_job_def()
            .get_subset(asset_selection=downstream)
            .execute_in_process(instance=instance, raise_on_error=False)
        )
        assert result.success
        names |= metadata_names(result)
    assert undocumented(names) == [], "describe these figures in docs/figures.md"
