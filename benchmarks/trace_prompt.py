"""How far one prompt travels: the eagle_data modules and the hops between them for one two-turn prompt through
the demo, on this checkout and on another (`--old PATH`, e.g. a worktree of main), measured in the same run.

Each checkout runs in its own process (PYTHONPATH and eagle_data's package path set to it) under a profiler
(`sys.setprofile`): a *module* is an eagle_data module one of whose functions ran (module bodies, i.e. imports,
are not counted); a *hop* is a call from a function of one eagle_data module into a function of another; an
*admission hop* is a hop between the modules that decide whether a request may go out (the dispatcher, the
budget, the in-flight limit, the breaker, and `runner/admission.py` where a checkout has it). Two runs per
checkout: the stage functions the assets call (prompts, estimate, generation, validation; `plain`), and the
same four assets materialized by Dagster in process (`dagster`). The prompt: one ShareGPT-schema conversation
with two user turns, read as b7_sharegpt on the demo profile (one shard of one prompt), answered by the
embedded local engine (the demo model).

    python benchmarks/trace_prompt.py [--old ../main]
One line per checkout and run, then `RESULT trace_prompt_hops <new hops / old hops>` (plain run; 1.0 without
--old).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ADMISSION = {"runner.dispatch", "runner.budget", "runner.concurrency", "runner.breaker", "runner.admission"}
CONVERSATION = {"id": "trace-1", "conversations": [
    {"from": "human", "value": "Name three rivers in Europe."},
    {"from": "gpt", "value": "The Danube, the Rhine and the Loire."},
    {"from": "human", "value": "Which of them is the longest?"},
]}  # fmt: skip


class Tracer:
    """Counts the eagle_data functions that ran, by module, and the calls between modules."""

    def __init__(self, package: Path) -> None:
        self.prefix = str(package) + os.sep
        self.modules: Counter[str] = Counter()
        self.hops: Counter[tuple[str, str]] = Counter()
        self.names: dict[str, str | None] = {}

    def module(self, frame: FrameType | None) -> str | None:
        if frame is None:
            return None
        path = frame.f_code.co_filename
        if path not in self.names:
            inside = path.startswith(self.prefix) and path.endswith(".py")
            self.names[path] = path[len(self.prefix) : -3].replace(os.sep, ".") if inside else None
        return self.names[path]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        callee = self.module(frame)
        if callee is None:
            return
        self.modules[callee] += 1
        caller = self.module(frame.f_back)
        if caller is not None and caller != callee:
            self.hops[(caller, callee)] += 1

    def figures(self) -> dict[str, Any]:
        admission = sum(n for (a, b), n in self.hops.items() if a in ADMISSION and b in ADMISSION)
        return {
            "modules": len(self.modules),
            "hops": sum(self.hops.values()),
            "admission_hops": admission,
            "admission_table": {
                f"{a}->{b}": n for (a, b), n in sorted(self.hops.items()) if a in ADMISSION and b in ADMISSION
            },
            "module_list": sorted(self.modules),
            "hop_table": {f"{a}->{b}": n for (a, b), n in sorted(self.hops.items())},
        }


def child(checkout: Path, mode: str, work: Path) -> dict[str, Any]:
    import eagle_data

    eagle_data.__path__ = [str(checkout / "eagle_data")]  # a namespace package: no module from another tree
    import threading

    from eagle_data import layout
    from eagle_data.catalog import load_catalog
    from eagle_data.defs.assets import build_dataset_assets
    from eagle_data.defs.io_managers import shard_resources
    from eagle_data.defs.resources import EngineResource, StorageResource

    source = work / "source.jsonl"
    source.write_text(json.dumps(CONVERSATION) + "\n")
    spec = load_catalog(profile="demo")["b7_sharegpt"].model_copy(
        update={"source": str(source), "max_prompts": 1, "shard_size": 1, "canary_prompts": 1, "regenerate": "all"}
    )  # both user turns answered (the demo profile answers only the first)
    storage, engine = StorageResource(root=str(work / "out")), EngineResource(kind="local")
    tracer = Tracer(checkout / "eagle_data")
    if mode == "dagster":
        import dagster as dg

        assets = build_dataset_assets(spec)
        instance = dg.DagsterInstance.ephemeral()
        threading.setprofile(tracer)
        sys.setprofile(tracer)
        try:
            result = dg.materialize(assets, partition_key="00000", instance=instance,
                                    resources=shard_resources(storage, engine=engine))  # fmt: skip
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        assert result.success
    else:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from compare_outputs import run_stages, stage_functions

        stage = stage_functions(checkout)
        threading.setprofile(tracer)
        sys.setprofile(tracer)
        try:
            store = storage.store()
            stage["estimate"](spec, store, engine.make(spec), canary_prompts=1, usd_per_prompt_token=0.0,
                              usd_per_completion_token=0.0, log=lambda line: None)  # fmt: skip
            run_stages(SimpleNamespace(**stage), spec, store, engine, {"log": lambda line: None})
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    store = storage.store()
    rows = store.read_shard(spec.name, layout.validated_asset(spec.name), "00000")
    assert rows.height == 1 and len(rows["messages"][0]) == 4, "the prompt did not come through with two replies"
    return tracer.figures()


def run_checkout(checkout: Path, mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_DATA_")}
    env.update(PYTHONPATH=str(checkout), EAGLE_DATA_PROFILE="demo", DAGSTER_HOME=tempfile.mkdtemp())
    if os.environ.get("EAGLE_DATA_DEMO_MODEL"):  # a demo model built already: no rebuild per checkout
        env["EAGLE_DATA_DEMO_MODEL"] = os.environ["EAGLE_DATA_DEMO_MODEL"]
    with tempfile.TemporaryDirectory() as work:
        cmd = [sys.executable, __file__, "--child", str(checkout), "--mode", mode, "--work", work]
        done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the {mode} run on {checkout} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="another checkout to measure in the same run")
    parser.add_argument("--modules", action="store_true", help="also list the modules each run passed through")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("plain", "dagster"), default="plain", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child.resolve(), args.mode, args.work)))
        return
    checkouts = {"new": REPO, **({"old": args.old.resolve()} if args.old else {})}
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for mode in ("plain", "dagster"):
        for name, checkout in checkouts.items():
            figures = found[(name, mode)] = run_checkout(checkout, mode)
            print(f"{name:3} {mode:7} modules {figures['modules']:3}  hops {figures['hops']:6,}  "
                  f"admission hops {figures['admission_hops']:4,}  ({checkout})")  # fmt: skip
            if args.modules:
                print("    " + " ".join(figures["module_list"]))
                print("    " + json.dumps(figures["admission_table"]))
    old = found.get(("old", "plain"), found[("new", "plain")])
    print(f"RESULT trace_prompt_hops {found[('new', 'plain')]['hops'] / max(old['hops'], 1):.3f}")


if __name__ == "__main__":
    main()
