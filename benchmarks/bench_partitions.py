"""1,800 partitions per dataset stay usable: definitions load, the nightly repair's and the sensors' ticks,
and the UI's partition view (GraphQL through dagster-webserver on 127.0.0.1), at the catalog's default
size and at `--partitions` (b7_sharegpt grown to that many shards; the other datasets as they are).

Each size gets its own instance (temp DAGSTER_HOME, the repository's dagster.yaml) holding a dataset in
the middle of its life: every shard of b7's generation materialized but three gaps, the first 2/9 of its
shards validated, with failed ERROR checks on some, and no prompts events (one event per shard and asset
costs ~0.2 s on a loaded 2-core machine), so the repair has every kind of work to find.

    python benchmarks/bench_partitions.py [--partitions 1800] [--repeats 3]
Last line: `RESULT partitions_slowdown <worst ratio, time at --partitions / time at the default size>`;
the targets are absolute: definitions under 5 s, each tick and the GraphQL view well under a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import dagster as dg
import pytest

REPO = Path(__file__).resolve().parents[1]
DATASET = "b7_sharegpt"
GAPS = ((0.05, 0.07), (0.4, 0.4005), (0.8, 0.9))  # shares of the partitions never generated
VALIDATED = 2 / 9  # share of the partitions validated (from the first)
FAILED_CHECKS = (0.1, 0.12)  # shares of the partitions whose empty_response check failed
DEFS_FILE = '''
from benchmarks.bench_partitions import grown_definitions
defs = grown_definitions({partitions})
'''
PARTITIONS_QUERY = """
query Partitions($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      partitionKeysByDimension { partitionKeys }
      assetPartitionStatuses {
        ... on DefaultPartitionStatuses { materializedPartitions failedPartitions unmaterializedPartitions }
      }
    }
  }
}
"""


def grown_definitions(partitions: int) -> dg.Definitions:
    """The code location with b7_sharegpt grown to `partitions` shards (0: the catalog as it is)."""
    from eagle_data.catalog import catalog
    from eagle_data.definitions import build_definitions

    specs = catalog()
    if partitions:
        grown = specs[DATASET]
        specs = {**specs, DATASET: grown.model_copy(update={"max_prompts": partitions * grown.shard_size})}
    return build_definitions(list(specs.values()))


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of `repeats` calls, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def load_seconds(partitions: int, repeats: int) -> float:
    """A fresh interpreter builds the definitions and its repository (what a code server does at start),
    minus importing dagster itself; wall seconds (CPU seconds printed too: on a shared machine they are the
figure that does not depend on the load)."""
    code = ("import time, dagster; t, cpu = time.perf_counter(), time.process_time(); "
            "from benchmarks.bench_partitions import grown_definitions; "
            f"grown_definitions({partitions}).get_repository_def().asset_graph; "
            "print(time.process_time() - cpu, time.perf_counter() - t)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            for _ in range(repeats)]  # fmt: skip
    cpu, wall = min(tuple(map(float, r.stdout.strip().splitlines()[-1].split())) for r in runs)
    print(f"  definitions of {partitions or 'the catalog'}: {cpu:.2f} CPU s, {wall:.2f} s wall", flush=True)
    return wall


def populate(instance: dg.DagsterInstance, keys: list[str]) -> None:
    """Generation of every shard but the gaps, the first shards validated, some of them failing a check."""
    n = len(keys)
    gaps = {i for first, last in GAPS for i in range(int(first * n), max(int(last * n), int(first * n) + 1))}
    for i, key in enumerate(keys):
        if i not in gaps:
            instance.report_runless_asset_event(dg.AssetMaterialization(DATASET, partition=key))
        if i < VALIDATED * n:
            instance.report_runless_asset_event(dg.AssetMaterialization(f"{DATASET}_validated", partition=key))
    for i in range(int(FAILED_CHECKS[0] * n), int(FAILED_CHECKS[1] * n)):
        instance.report_runless_asset_event(dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey(f"{DATASET}_validated"), check_name="empty_response", passed=False,
            severity=dg.AssetCheckSeverity.ERROR, partition=keys[i]))  # fmt: skip


def graphql_seconds(home: Path, partitions: int, repeats: int) -> tuple[float, int]:
    """Time of the asset's partition statuses through dagster-webserver; returns (seconds, partitions seen)."""
    from eagle_data.standins.local import free_port

    defs_file = home / "bench_defs.py"
    defs_file.write_text(DEFS_FILE.format(partitions=partitions))
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(["dagster-webserver", "-h", "127.0.0.1", "-p", str(port), "-f", str(defs_file)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}/graphql"
    body = json.dumps({"query": PARTITIONS_QUERY, "variables": {"key": {"path": [DATASET]}}}).encode()

    def query() -> dict:
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                seen = query()["data"]["assetNodeOrError"]
                break
            except OSError:
                assert time.monotonic() < deadline, "dagster-webserver did not answer within 180 s"
                time.sleep(1)
        if "partitionKeysByDimension" not in (seen or {}):
            raise RuntimeError(f"the UI did not load the code location: {json.dumps(seen)[:500]}")
        return timed(query, repeats), len(seen["partitionKeysByDimension"][0]["partitionKeys"])
    finally:
        server.terminate()
        server.wait(30)


def measure(partitions: int, repeats: int) -> dict[str, float]:
    os.environ.setdefault("EAGLE_DATA_PROFILE", "")
    defs = grown_definitions(partitions)
    repo = defs.get_repository_def()
    keys = repo.asset_graph.get(dg.AssetKey(DATASET)).partitions_def.get_partition_keys()
    home = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    figures = {"partitions": float(len(keys)), "definitions_load_s": load_seconds(partitions, repeats)}
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            start = time.perf_counter()
            populate(instance, keys)
            print(f"  {len(keys)} partitions: instance filled in {time.perf_counter() - start:.0f} s", flush=True)
            schedule = repo.get_schedule_def(f"{DATASET}_nightly_repair")
            night = datetime(2026, 12, 1, 3)
            result: list = []

            def repair() -> None:
                with dg.build_schedule_context(instance=instance, scheduled_execution_time=night,
                                               repository_def=repo) as context:  # fmt: skip
                    result[:] = [schedule.evaluate_tick(context)]

            figures["repair_tick_s"] = timed(repair, repeats)
            figures["repair_runs"] = float(len(result[0].run_requests or []))
            for name in ("quality_alerts", "catalog_order", "dead_run_reaper"):
                sensor = repo.get_sensor_def(name)

                def tick(sensor: dg.SensorDefinition = sensor) -> None:
                    with dg.build_sensor_context(instance=instance, repository_def=repo) as context:
                        sensor.evaluate_tick(context)

                figures[f"{name}_tick_s"] = timed(tick, repeats)
        figures["graphql_partitions_s"], seen = graphql_seconds(home, partitions, repeats)
        assert seen == len(keys), f"the UI saw {seen} partitions, expected {len(keys)}"
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return figures


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=1800)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    base = measure(0, args.repeats)
    print(f"  default size: {base}", flush=True)
    grown = measure(args.partitions, args.repeats)
    print(f"repairs ask for {int(base['repair_runs'])} and {int(grown['repair_runs'])} range runs", flush=True)
    print(f"{'figure':<24}{int(base['partitions']):>10}{int(grown['partitions']):>10}   (partitions of {DATASET})")
    for name in base:
        if name != "partitions":
            print(f"{name:<24}{base[name]:>10.3f}{grown[name]:>10.3f}", flush=True)
    slowdown = max(grown[n] / base[n] for n in base if n.endswith("_s") and base[n] > 0)
    print(f"RESULT partitions_slowdown {slowdown:.2f}")
    return grown["definitions_load_s"]


@pytest.mark.benchmark
def test_1800_partitions_load_in_under_5_s() -> None:
    assert main([]) < 5.0


if __name__ == "__main__":
    main()
