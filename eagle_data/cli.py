"""`eagle-data`: the newcomer's entry points. Real work goes through `dagster` itself."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEMO_DATASET = "b7_sharegpt"


def _dagster_env() -> dict[str, str]:
    env = dict(os.environ)
    home = Path(env.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    instance_yaml = Path(__file__).resolve().parent.parent / "dagster.yaml"
    if instance_yaml.is_file() and not (home / "dagster.yaml").exists():
        shutil.copy(instance_yaml, home / "dagster.yaml")
    env["DAGSTER_HOME"] = str(home)
    return env


def demo(dataset: str = DEMO_DATASET) -> int:
    """Materialize every partition of one dataset's three assets on the embedded demo model."""
    os.environ.setdefault("EAGLE_DATA_PROFILE", "demo")
    from eagle_data import pipeline
    from eagle_data.catalog import get_dataset
    from eagle_data.demo import ensure_demo_model
    from eagle_data.storage import ShardStore

    spec = get_dataset(dataset)
    print(f"[eagle-data] demo model: {ensure_demo_model()} (random weights: its text is meaningless; "
          "real runs use EAGLE_DATA_ENGINE=openrouter or sglang)", flush=True)
    keys = spec.partition_keys
    selection = f"{dataset}_prompts,{dataset},{dataset}_validated"
    cmd = [
        sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_data.definitions",
        "--select", selection, "--partition-range", f"{keys[0]}...{keys[-1]}",
    ]
    print(f"[eagle-data] {' '.join(cmd[2:])}", flush=True)
    started = time.perf_counter()
    code = subprocess.call(cmd, env=_dagster_env())
    if code:
        print(f"[eagle-data] the run failed (exit {code}); the log above says where", file=sys.stderr)
        return code
    store = ShardStore()
    validated = pipeline.shards_written(store, dataset, pipeline.validated_asset(spec))
    print(f"[eagle-data] done in {time.perf_counter() - started:.0f} s: {len(keys)} partitions of {selection}")
    print(f"[eagle-data] output: {store.uri(dataset)}/  ({len(validated)} validated shards)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle-data", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="set up the demo model and materialize one dataset end to end")
    run.add_argument("--dataset", default=DEMO_DATASET)
    sub.add_parser("demo-model", help="build the tiny random-weight demo checkpoint (offline)")
    args = parser.parse_args(argv)
    from eagle_data.catalog import CatalogError

    try:
        if args.command == "demo-model":
            from eagle_data.demo import ensure_demo_model

            print(ensure_demo_model())
            return 0
        return demo(args.dataset)
    except CatalogError as exc:
        print(f"eagle-data: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
