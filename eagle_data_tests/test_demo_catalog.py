"""The whole catalog on the demo profile: `catalog_order` walks every dataset, and every dataset's run is
green (one shard each, the demo model). The demo's text is word salad; its data must still pass the gates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from eagle_data.catalog import DatasetSpec, catalog
from eagle_data.definitions import build_definitions
from eagle_data.defs.catalog_order import ORDER_TAG

pytestmark = pytest.mark.e2e


@pytest.fixture
def demo_catalog(monkeypatch: pytest.MonkeyPatch, demo_model: Path, tmp_path: Path) -> Iterator[list[DatasetSpec]]:
    """Every catalog dataset on the demo profile, one shard each."""
    for name in ("EAGLE_DATA_ENGINE", "EAGLE_DATA_POOL", "EAGLE_DATA_MODEL", "EAGLE_DATA_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model))
    monkeypatch.setenv("EAGLE_DATA_ROOT", str(tmp_path / "out"))
    catalog.cache_clear()  # the catalog is read once per process; this test switches profile
    yield [spec.model_copy(update={"max_prompts": spec.shard_size}) for spec in catalog().values()]
    catalog.cache_clear()


def test_catalog_order_on_the_demo_makes_every_dataset_green(demo_catalog: list[DatasetSpec]) -> None:
    defs = build_definitions(demo_catalog)
    sensor, cursor, outcomes = defs.resolve_sensor_def("catalog_order"), None, {}
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
    assert json.loads(cursor or "{}").get("index") == len(demo_catalog) - 1
    assert outcomes == {spec.name: "green" for spec in demo_catalog}
