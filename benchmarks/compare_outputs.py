"""Same inputs, two versions of this repo: are the prompts, token ids, loss masks and training mix identical?

Runs the same stages on this checkout ("new") and on another (`--old PATH`, e.g. a worktree of an older
main), each in its own process with PYTHONPATH (and eagle_data's package path) set to that checkout, then
compares what they wrote. Stages, through the stage functions the assets call, over every partition:
write_prompts, generate, validate, export (training mix, seed 0). Signatures that changed between versions
(export's shard admissions) are detected in the child.

Default: a synthetic ShareGPT-schema JSONL source (bench_scale.write_source, `--prompts` rows) read as
b7_sharegpt (mix weight 1) and, capped at a fifth of it, b8_perfectblend (mix weight 0.5, so the mix also
samples), answered by one shared fake OpenAI server (eagle_data/standins/openai_fake.py of this tree,
no faults). Its replies are a function of the prompt id and turn only (crc32 of "id#turn" sets the length;
its random draws decide faults and latency, both off), which the run also probes.
`--demo`: the demo profile's datasets (bundled samples) on the embedded local engine (the random-weight
demo model; each reply seeded from its prompt id and turn). The current tree is run twice first: if the two
runs differ, demo generation is not deterministic and the comparison is skipped.

    python benchmarks/compare_outputs.py --old ../oldmain [--prompts 5000] [--work DIR]
    python benchmarks/compare_outputs.py --old ../oldmain --demo
One line per comparison, then `RESULT identical <true|false>` (`skipped` when the demo is not deterministic).
Verdict counts may differ on purpose (new rules); the export lines then say whether the verdict changes
explain the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl

REPO = Path(__file__).resolve().parents[1]
FIXTURE = {"b7_sharegpt": {}, "b8_perfectblend": {"mix_weight": 0.5, "share": 0.2}}
DEMO_DATASETS = ("b3_magicoder", "b4_mixturethoughts", "b5_openthoughts", "b6_ultrachat", "b7_sharegpt",
                 "b8_perfectblend")  # fmt: skip
MODEL = "compare"
TABLES = ("prompts", "generations", "validated", "train", "mix")


# ---- the child: one checkout's pipeline, then its outputs in a neutral shape -----------------------------
def child(checkout: Path, root: Path, dump: Path, source: str, prompts: int, url: str) -> None:
    import eagle_data

    eagle_data.__path__ = [str(checkout / "eagle_data")]  # a namespace package: no module from another tree
    import inspect

    from eagle_data import layout
    from eagle_data.catalog import load_catalog
    from eagle_data.defs.resources import EngineResource
    from eagle_data.storage import ShardStore

    stage = SimpleNamespace(**stage_functions(checkout))
    store, demo = ShardStore(str(root)), not source
    catalog = load_catalog(profile="demo" if demo else "")
    if demo:
        specs = [catalog[name] for name in DEMO_DATASETS]
        engine = EngineResource(kind="local")
    else:
        specs = [catalog[name].model_copy(update={
            "source": source, "max_prompts": int(prompts * extra.get("share", 1)), "target": "qwen3-test",
            "token_budget": 0, "cost_budget_usd": 0.0, "regenerate": "all", "mix_weight": extra.get("mix_weight", 1.0),
        }) for name, extra in FIXTURE.items()]  # fmt: skip
        os.environ["EAGLE_DATA_BASE_URL"] = url  # a URL reaches the engine through the environment only
        engine = EngineResource(kind="openai", model=MODEL, api_key_env="OPENAI_API_KEY")
    quiet = {"log": lambda line: None}
    for spec in specs:
        run_stages(stage, spec, store, engine, quiet)
    validated = {spec.name: stage.shards_written(store, spec.name, layout.validated_asset(spec.name)) for spec in specs}
    if "admissions" in inspect.signature(stage.export).parameters:
        from eagle_data.exports import Admission

        admissions = {name: Admission(tuple(keys)) for name, keys in validated.items()}
        figures = stage.export(specs, store, admissions, seed=0, **quiet)
    else:
        figures = stage.export(specs, store, seed=0)
    tables: dict[str, list[pl.DataFrame]] = {name: [] for name in TABLES}
    shards = (
        ("prompts", lambda spec: layout.prompts_asset(spec.name), ["messages"]),
        ("generations", lambda spec: spec.name, ["status", "messages"]),
        ("validated", lambda spec: layout.validated_asset(spec.name), ["input_ids", "loss_mask", "verdict"]),
    )
    for spec in specs:
        for table, asset_of, columns in shards:
            for key in stage.shards_written(store, spec.name, asset_of(spec)):
                frame = store.read_shard(spec.name, asset_of(spec), key).select("prompt_id", *columns)
                tables[table].append(neutral(frame).with_columns(dataset=pl.lit(spec.name), partition=pl.lit(key)))
        old_key = f"{spec.name}/export/train.parquet"
        keys = stage.export_keys(spec) if hasattr(stage, "export_keys") else {"train": old_key}
        train = keys["train"] if isinstance(keys, dict) else keys[1]  # a tuple (file, train) before the registry
        tables["train"].append(neutral(store.read_frame(train)))
    tables["mix"].append(neutral(pl.read_parquet(figures["mix_path"])))
    for name, frames in tables.items():
        pl.concat(frames, how="vertical").write_parquet(dump / f"{name}.parquet")
    strays = [n for n, m in sys.modules.items() if n.startswith("eagle_data") and
              not str(getattr(m, "__file__", None) or checkout).startswith(str(checkout))]  # fmt: skip
    if strays:
        raise SystemExit(f"imported eagle_data modules from outside {checkout}: {strays[:3]}")


def stage_functions(checkout: Path) -> dict[str, Any]:
    """The checkout's stage functions by name: those eagle_data/pipeline.py defines (every stage, in older
    checkouts), then each eagle_data/stages/ module's own (where issue 33 moved them) and the shard writer's."""
    import importlib

    package = checkout / "eagle_data"
    modules = ["pipeline"] if (package / "pipeline.py").is_file() else []
    modules += [f"stages.{path.stem}" for path in sorted((package / "stages").glob("*.py")) if path.stem != "__init__"]
    modules += ["storage.shards"] if (package / "storage" / "shards.py").is_file() else []
    found: dict[str, Any] = {}
    for name in modules:
        module = importlib.import_module(f"eagle_data.{name}")
        found.update({k: v for k, v in vars(module).items() if callable(v) and v.__module__ == module.__name__})
    return found


def run_stages(stage: Any, spec: Any, store: Any, engine: Any, quiet: dict[str, Any]) -> None:
    """prompts, generation and validation over every partition: the stage functions and the shard writer the
    IO manager uses where the checkout has them (`make_prompts`, `write_shards`), else the older functions
    that wrote their own shards."""
    import inspect

    from eagle_data import layout

    keys, backend, settings = spec.partition_keys, engine.make(spec), engine.runner_settings()
    if "make_prompts" not in vars(stage):
        stage.write_prompts(spec, store, keys)
        stage.generate(spec, store, keys, backend, settings=settings, **quiet)
        logs = "log" in inspect.signature(stage.validate).parameters
        stage.validate(spec, store, keys, **(quiet if logs else {}))
        return
    from eagle_data.stages.prompts import PromptShards
    from eagle_data.storage.shards import StoredShards

    stage.write_shards(store, spec.name, layout.prompts_asset(spec.name), stage.make_prompts(spec, store, keys).shards)
    made = stage.generate(spec, store, PromptShards(spec, store, keys), backend, settings=settings, **quiet)
    stage.write_shards(store, spec.name, spec.name, made.shards)
    done = stage.validate(spec, store, StoredShards(store, spec.name, spec.name, keys), **quiet)
    stage.write_shards(store, spec.name, layout.validated_asset(spec.name), done.shards)


def neutral(frame: pl.DataFrame) -> pl.DataFrame:
    """Version-neutral columns: messages as sorted-key JSON text, ids and masks as Int64 lists."""
    out = frame
    if "messages" in frame.columns:
        out = out.with_columns(messages=pl.Series([json.dumps(m, sort_keys=True) for m in frame["messages"].to_list()]))
    lists = [c for c in ("input_ids", "loss_mask") if c in frame.columns]
    return out.with_columns(pl.col(c).cast(pl.List(pl.Int64)) for c in lists)


# ---- the parent: runs, the server, the comparisons ---------------------------------------------------------
def run_checkout(checkout: Path, out: Path, source: str, prompts: int, url: str) -> Path:
    root, dump = out / "root", out / "dump"
    dump.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_DATA_")}
    env.update(PYTHONPATH=str(checkout), OPENAI_API_KEY="compare")
    env.update({"EAGLE_DATA_PROFILE": "demo"} if not source else {"EAGLE_DATA_ENGINE": "openai"})
    cmd = [sys.executable, __file__, "--child", str(checkout), "--root", str(root), "--dump", str(dump),
           "--source", source, "--prompts", str(prompts), "--url", url]  # fmt: skip
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the run on {checkout} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dump


def start_server() -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "eagle_data.standins.openai_fake", "--faults", '{"reply_tokens": [40, 160]}']
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}/v1"


def probe_server(url: str) -> bool:
    """The same prompt asked twice, with other prompts between, gets the same reply."""

    def ask(prompt_id: str) -> Any:
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt_id}]}
        headers = {"Content-Type": "application/json", "X-Eagle-Prompt-Id": prompt_id}
        request = urllib.request.Request(f"{url}/chat/completions", json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.load(reply)["choices"]

    first = ask("probe-a")
    for i in range(20):
        ask(f"probe-{i}")
    return ask("probe-a") == first


def load(dump: Path) -> dict[str, pl.DataFrame]:
    return {name: pl.read_parquet(dump / f"{name}.parquet") for name in TABLES}


def first_difference(old: pl.DataFrame, new: pl.DataFrame, columns: list[str], by: list[str]) -> str:
    """`identical (N rows)`, or the first difference, group by group of `by` (row order counts)."""
    if not by:  # one group: the whole frame
        old, new, by = old.with_columns(whole=pl.lit(0)), new.with_columns(whole=pl.lit(0)), ["whole"]
    if old.select(by).unique(maintain_order=True).rows() != new.select(by).unique(maintain_order=True).rows():
        return f"DIFFERENT groups {by}: old {old.select(by).unique().height}, new {new.select(by).unique().height}"
    for group, a in old.group_by(by, maintain_order=True):
        where = dict(zip(by, group, strict=True))
        b = new.filter(*(pl.col(c) == v for c, v in where.items()))
        if a.height != b.height:
            return f"DIFFERENT {where}: {a.height} rows old, {b.height} new"
        for column in columns:
            x, y = a[column].to_list(), b[column].to_list()
            if x != y:
                at = next(i for i, pair in enumerate(zip(x, y, strict=True)) if pair[0] != pair[1])
                return f"DIFFERENT {where} column {column} at row {at} (prompt {a['prompt_id'][at]})"
    return f"identical ({old.height} rows)"


SHARDS = {"prompts": ["prompt_id", "messages"], "generations": ["prompt_id", "status", "messages"],
          "validated": ["prompt_id", "input_ids", "loss_mask"]}  # fmt: skip
EXPORTED = ["prompt_id", "dataset", "input_ids", "loss_mask"]


def compare(old: dict[str, pl.DataFrame], new: dict[str, pl.DataFrame]) -> bool:
    """Print one line per comparison; True when every output (verdict counts aside) is identical."""
    same = True
    for table, columns in SHARDS.items():
        line = first_difference(old[table], new[table], columns, ["dataset", "partition"])
        same &= line.startswith("identical")
        print(f"{table} shards, per partition in order ({', '.join(columns)}): {line}")
    counts = [dict(side["validated"].group_by("verdict").len().rows()) for side in (old, new)]
    verdicts = sorted(set(counts[0]) | set(counts[1]))
    print(
        "verdicts (old -> new): " + ", ".join(f"{v} {counts[0].get(v, 0)} -> {counts[1].get(v, 0)}" for v in verdicts)
    )
    joined = old["validated"].join(new["validated"], on=["dataset", "prompt_id"], suffix="_new")
    changed = joined.filter(pl.col("verdict") != pl.col("verdict_new")).select("prompt_id", "verdict", "verdict_new")
    print(f"verdict changes: {changed.height} rows" + f", e.g. {changed.head(10).rows()}" * bool(changed.height))
    inputs_moved = False  # the train rows differ, and only by verdict changes
    for table in ("train", "mix"):
        a, b = old[table].select(EXPORTED), new[table].select(EXPORTED)
        line = first_difference(a, b, EXPORTED, ["dataset"] if table == "train" else [])
        if not line.startswith("identical"):
            only = set(a["prompt_id"]) ^ set(b["prompt_id"])
            kept = [side.filter(~pl.col("prompt_id").is_in(list(only))) for side in (a, b)]
            # the mix is a seeded sample and shuffle of the train rows: other rows in, another order out
            explained = only <= set(changed["prompt_id"]) and (
                inputs_moved if table == "mix" else kept[0].equals(kept[1])
            )
            inputs_moved |= explained
            line += (
                f"; {len(only)} prompt ids on one side only: {'fully' if explained else 'NOT'} explained by verdicts"
            )
            same = False
        print(f"export {table} ({a.height} rows old, {b.height} new; {', '.join(EXPORTED)} in order): {line}")
    return same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, help="a checkout of the other version")
    ap.add_argument("--demo", action="store_true", help="the demo profile's datasets on the local demo model")
    ap.add_argument("--prompts", type=int, default=5_000)
    ap.add_argument("--work", type=Path, help="keep sources and outputs under this folder (default: a temp folder)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    for name in ("--root", "--dump", "--source", "--url"):
        ap.add_argument(name, default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, Path(args.root), Path(args.dump), args.source, args.prompts, args.url)
        return 0
    if not args.old or not (args.old / "eagle_data" / "catalog.py").is_file():
        raise SystemExit("--old must name a checkout of this repo (a folder holding eagle_data/catalog.py)")
    work = args.work or Path(tempfile.mkdtemp(prefix="compare-outputs-"))
    work.mkdir(parents=True, exist_ok=True)
    old_tree = args.old.resolve()
    print(f"new {REPO} ({git_head(REPO)}), old {old_tree} ({git_head(old_tree)}), outputs under {work}")
    if args.demo:
        first, again = (load(run_checkout(REPO, work / name, "", 0, "")) for name in ("new", "new_again"))
        print("determinism: the current tree run twice")
        if not compare(first, again):
            print("demo generation is not deterministic across runs: comparison skipped\nRESULT identical skipped")
            return 1
        old = load(run_checkout(old_tree, work / "old", "", 0, ""))
        print("comparison: old vs new")
        same = compare(old, first)
        print(f"RESULT identical {str(same).lower()}")
        return 0
    from bench_scale import write_source

    source = str(write_source(work / "sharegpt.jsonl", args.prompts))
    server, url = start_server()
    try:
        print(f"fake server replies deterministic per prompt (probe): {probe_server(url)}")
        new = load(run_checkout(REPO, work / "new", source, args.prompts, url))
        old = load(run_checkout(old_tree, work / "old", source, args.prompts, url))
    finally:
        server.terminate()
        server.wait(10)
    print(f"RESULT identical {str(compare(old, new)).lower()}")
    return 0


def git_head(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "not a git checkout"


if __name__ == "__main__":
    sys.exit(main())
