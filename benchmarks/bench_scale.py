"""Every stage at scale: peak memory, CPU and wall seconds per stage, at 10k and 200k prompts (1M with --million).

A synthetic ShareGPT-schema JSONL source (1-2 user turns, plus ~1% bad rows), a local OpenAI-compatible server
that answers at once (its own process), and the stages through the same stage functions the assets
call, each stage's shards stored by the shard IO manager's writer (`write_shards`), over every partition in
one call (as a single-run backfill does):
  prompts      stages.prompts.make_prompts (builds the prompt index), every prompts shard stored
  prompts_one  the same for one partition, with the index saved (a one-shard run)
  estimate     stages.estimate.estimate (8 sample prompts answered, every prompt's tokens counted)
  generation   stages.generation.generate with the engine and runner settings of the `engine` resource
  validation   stages.validation.validate (token ids, loss masks, verdicts, quality reports)
  export       stages.export.export (SpecForge JSONL, tokenized parquet, the training mix)
  raw_encode   the baseline: the target tokenizer's encode_batch on all cores, over the validated texts
Each stage runs in its own process; its peak RSS, user+system CPU seconds and wall seconds come from
os.wait4 on that process (ru_maxrss: the largest single process of its tree).

    python benchmarks/bench_scale.py [--sizes 10000 200000] [--million] [--keep DIR]
    pytest benchmarks/bench_scale.py -m benchmark
Last lines: `RESULT memory_flatness <min over stages of peak RSS at the smallest size / at 200k, or at the
largest size when 200k was not run>` (target >= 0.67; the heaviest stage at the largest size is printed
above it, target < 4 GB at 1M) and `RESULT validate_vs_raw_parallel <validation rows/s / raw encode_batch rows/s>`
(target >= 0.6, measured at the largest size).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
STAGES = ("prompts", "prompts_one", "estimate", "generation", "validation", "export")
FLATNESS_SIZE = 200_000  # memory_flatness compares the smallest size with this one (the definition)
RAW_SAMPLE_ROWS = 20_000  # rows the raw encode baseline times (a rate, so a sample is enough)
VOCABULARY = (
    "draft model target token verify accept reject speculative decoding batch cache layer head attention "
    "prompt reply reason step answer question code python function return value list dict string number"
)
WORDS = VOCABULARY.split()


# ---- the synthetic source and the server ----------------------------------------------------------
def write_source(path: Path, prompts: int, seed: int = 0) -> Path:
    """ShareGPT-schema JSONL: `{"id", "conversations": [{"from", "value"}, ...]}`, written streaming: `prompts`
    good rows, with one bad row after every 99 (counted skips, like a real dump), so the prompts fill exactly
    the partitions `max_prompts = prompts` makes."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        written, i = 0, -1
        while written < prompts:
            i += 1
            if i % 100 == 99:
                fh.write(json.dumps({"id": f"bad{i}", "conversations": [{"from": "gpt", "value": "orphan"}]}) + "\n")
                continue
            written += 1
            turns = [{"from": "human", "value": f"#{i} " + " ".join(rng.choices(WORDS, k=rng.randint(10, 120)))}]
            turns.append({"from": "gpt", "value": " ".join(rng.choices(WORDS, k=rng.randint(20, 200)))})
            if rng.random() < 0.25:
                turns.append({"from": "human", "value": "and then " + " ".join(rng.choices(WORDS, k=20))})
                turns.append({"from": "gpt", "value": " ".join(rng.choices(WORDS, k=rng.randint(20, 100)))})
            fh.write(json.dumps({"id": f"sg{i}", "conversations": turns}) + "\n")
    return path


def start_server() -> tuple[subprocess.Popen[str], str]:
    faults = json.dumps({"reply_tokens": [40, 160]})
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle_data.standins.openai_fake", "--faults", faults],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env=_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[1])
    return proc, f"http://127.0.0.1:{port}/v1"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_DATA_")}
    return {**env, "PYTHONPATH": str(REPO), "OPENAI_API_KEY": "bench", **extra}


# ---- one stage, in its own process ----------------------------------------------------------------
def spec_for(source: str, prompts: int) -> Any:
    from eagle_data.catalog import load_catalog

    base = load_catalog(profile="")["b7_sharegpt"]
    return base.model_copy(
        update={"source": source, "max_prompts": prompts, "target": "qwen3-test", "token_budget": 0,
                "cost_budget_usd": 0.0, "regenerate": "all"}
    )  # fmt: skip


def run_stage(stage: str, root: str, source: str, prompts: int, url: str) -> dict[str, Any]:
    """Run one stage in this process; returns its figures (rows handled)."""
    from eagle_data import layout
    from eagle_data.stages import generation, validation
    from eagle_data.stages import prompts as prompts_stage
    from eagle_data.storage import ShardStore
    from eagle_data.storage.shards import StoredShards, write_shards

    spec, store = spec_for(source, prompts), ShardStore(root)
    keys = spec.partition_keys
    if stage in ("prompts", "prompts_one"):
        made = prompts_stage.make_prompts(spec, store, keys if stage == "prompts" else keys[:1])
        return {"rows": sum(s.rows for s in write_shards(store, spec.name, layout.prompts_asset(spec.name),
                                                         made.shards).values())}  # fmt: skip
    if stage in ("estimate", "generation"):
        from eagle_data.defs.resources import EngineResource

        os.environ["EAGLE_DATA_BASE_URL"] = url  # a URL reaches the engine through the environment only
        engine = EngineResource(kind="openai", model="bench")
        settings = engine.runner_settings()
        if stage == "estimate":
            from eagle_data.stages.estimate import estimate as run_estimate

            estimate = run_estimate(
                spec, store, engine.make(spec), usd_per_prompt_token=0.0, usd_per_completion_token=0.0,
                log=lambda line: None, settings=settings,
            ).estimate  # fmt: skip
            assert estimate is not None, "the bench server answered no canary prompt"
            return {"rows": estimate.prompts, "turns": estimate.turns}
        inputs = prompts_stage.PromptShards(spec, store, keys)
        made = generation.generate(spec, store, inputs, engine.make(spec), log=lambda line: None, settings=settings)
        write_shards(store, spec.name, spec.name, made.shards)
        return {"rows": made.figures.get("done", 0), "requests": made.figures.get("requests", 0)}
    if stage == "validation":
        done = validation.validate(spec, store, StoredShards(store, spec.name, spec.name, keys))
        return {"rows": sum(s.rows for s in write_shards(store, spec.name, layout.validated_asset(spec.name),
                                                         done.shards).values())}  # fmt: skip
    if stage == "export":
        from eagle_data.exports import Admission
        from eagle_data.stages.export import export
        from eagle_data.storage.shards import shards_written

        written = shards_written(store, spec.name, layout.validated_asset(spec.name))
        figures = export([spec], store, {spec.name: Admission(tuple(written))}, seed=0, log=lambda line: None)
        return {"rows": figures.get("mix_rows", 0)}
    if stage == "raw_encode":
        return raw_encode(spec, store, keys)
    raise SystemExit(f"unknown stage {stage}")


def raw_encode(spec: Any, store: Any, keys: list[str]) -> dict[str, Any]:
    """The tokenizer alone on every core: encode_batch over the validated rows' texts (decoded from their
    ids, untimed), on up to RAW_SAMPLE_ROWS rows; returns rows per second."""
    from eagle_data import layout
    from eagle_data.targets import load_target

    target = load_target(spec.target)
    ids: list[list[int]] = []
    for key in keys:
        ids += store.read_shard(spec.name, layout.validated_asset(spec.name), key)["input_ids"].to_list()
        if len(ids) >= RAW_SAMPLE_ROWS:
            break
    texts = target.text_encoder.decode_batch(ids[:RAW_SAMPLE_ROWS], skip_special_tokens=False)
    started = time.perf_counter()
    target.tokenizer.encode_batch(texts, add_special_tokens=False)
    seconds = time.perf_counter() - started
    return {"rows": len(texts), "rows_per_s": len(texts) / seconds}


def measure(stage: str, root: Path, source: Path, prompts: int, url: str) -> dict[str, Any]:
    """Run `stage` in a child process; its figures plus peak RSS (GB), CPU s and wall s."""
    cmd = [sys.executable, __file__, "--stage", stage, "--root", str(root), "--source", str(source),
           "--prompts", str(prompts), "--url", url]  # fmt: skip
    parallel = "true" if stage == "raw_encode" else os.environ.get("TOKENIZERS_PARALLELISM", "true")
    started = time.perf_counter()
    env = _env(TOKENIZERS_PARALLELISM=parallel, EAGLE_DATA_ENGINE="openai")  # the engine kind comes from here only
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"stage {stage} at {prompts} prompts failed (exit {proc.returncode})")
    figures = json.loads(out.strip().splitlines()[-1])
    return {**figures, "rss_gb": usage.ru_maxrss / 1024**2, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall}


# ---- the whole benchmark ---------------------------------------------------------------------------
def bench(sizes: list[int], keep: Path | None) -> dict[int, dict[str, dict[str, Any]]]:
    results: dict[int, dict[str, dict[str, Any]]] = {}
    server, url = start_server()
    try:
        for size in sizes:
            work = Path(tempfile.mkdtemp(prefix=f"bench-scale-{size}-", dir=keep))
            source = write_source(work / "sharegpt.jsonl", size)
            results[size] = {}
            for stage in (*STAGES, "raw_encode"):
                results[size][stage] = measure(stage, work / "out", source, size, url)
                print(f"{size:>9} {stage:<12} {json.dumps(results[size][stage])}", flush=True)
            if keep is None:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        server.terminate()
        server.wait(10)
    return results


def report(results: dict[int, dict[str, dict[str, Any]]]) -> tuple[float, float]:
    sizes = sorted(results)
    print("\n| stage | prompts | CPU s | wall s | peak RSS GB | rows |\n|---|---:|---:|---:|---:|---:|")
    for stage in (*STAGES, "raw_encode"):
        for n in sizes:
            c = results[n][stage]
            print(f"| {stage} | {n:,} | {c['cpu_s']:.1f} | {c['wall_s']:.1f} | {c['rss_gb']:.2f} | {c['rows']:,} |")
    small, large = sizes[0], sizes[-1]
    compared = FLATNESS_SIZE if FLATNESS_SIZE in results and small != FLATNESS_SIZE else large
    flatness = min(results[small][s]["rss_gb"] / results[compared][s]["rss_gb"] for s in STAGES)
    print(f"memory flatness: peak RSS at {small:,} / at {compared:,} prompts, the least flat stage")
    heaviest = max(STAGES, key=lambda s: results[large][s]["rss_gb"])
    print(f"heaviest stage at {large:,} prompts: {heaviest}, {results[large][heaviest]['rss_gb']:.2f} GB (target < 4)")
    validation = results[large]["validation"]
    validate_rate = validation["rows"] / validation["wall_s"]
    raw_rate = results[large]["raw_encode"]["rows_per_s"]
    print(f"validation {validate_rate:.0f} rows/s; raw encode_batch on {os.cpu_count()} cores {raw_rate:.0f} rows/s")
    return flatness, validate_rate / raw_rate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 200_000])
    ap.add_argument("--million", action="store_true", help="add a 1,000,000-prompt run")
    ap.add_argument("--keep", type=Path, help="keep each size's source and output under this folder")
    ap.add_argument("--stage", choices=(*STAGES, "raw_encode"), help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.stage:
        print(json.dumps(run_stage(args.stage, args.root, args.source, args.prompts, args.url)))
        return 0
    sizes = sorted(set(args.sizes + ([1_000_000] if args.million else [])))
    flatness, validate_ratio = report(bench(sizes, args.keep))
    print(f"RESULT memory_flatness {flatness:.3f}")
    print(f"RESULT validate_vs_raw_parallel {validate_ratio:.3f}")
    return 0


@pytest.mark.benchmark
def test_bench_scale() -> None:
    assert main([]) == 0


if __name__ == "__main__":
    sys.exit(main())
