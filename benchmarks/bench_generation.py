"""Generation pipeline throughput vs a bare aiohttp loop, against the same local server in the same run.

2,000 in flight, a server answering after 1 s (in its own process, so it does not take the client's
core), >= 10,000 requests. The pipeline is the whole `run_generation` call: engine, limiter, retries,
result log parts, shard files. Both sides start at 2,000 in flight, so the ratio measures client
overhead; the cold-start ramp (the default low start) is reported as a separate figure. The pipeline runs
with the breaker (every reply judged on arrival, eagle_data/runner/breaker.py) on and off in the same run.

    python benchmarks/bench_generation.py [--requests 10000] [--in-flight 2000] [--latency 1.0]
    pytest benchmarks/bench_generation.py -m benchmark
Last lines: `RESULT generation_vs_aiohttp <ratio>` (target >= 0.9), `RESULT breaker_overhead <on/off
throughput>` (target >= 0.95).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import polars as pl
import pytest

from eagle_data.catalog import Breaker, load_catalog
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.storage import ShardStore

SHARD_SIZE = 500
PROMPT = [{"role": "user", "content": "Write a haiku about speculative decoding."}]


def start_server(latency_s: float) -> tuple[subprocess.Popen[str], str]:
    faults = json.dumps({"latency_s": latency_s, "reply_tokens": [150, 200]})  # replies of many lengths: no repeat
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle_data.standins.openai_fake", "--faults", faults],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[1])
    return proc, f"http://127.0.0.1:{port}/v1"


async def bare_loop(url: str, n: int, in_flight: int) -> float:
    """The baseline: a semaphore, one session, POST and parse JSON. Returns req/s."""
    sem = asyncio.Semaphore(in_flight)
    body = {"model": "bench", "max_tokens": 4096, "messages": PROMPT}
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            async with (
                sem,
                session.post(f"{url}/chat/completions", json=body, headers={"X-Eagle-Prompt-Id": str(i)}) as r,
            ):
                await r.json()

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - started)


def pipeline(url: str, n: int, in_flight: int, initial: int, breaker: bool = True) -> tuple[float, dict[str, int]]:
    """The whole run_generation call over n prompts in shards of 500. Returns (req/s, errors)."""
    spec = load_catalog(profile="")["b7_sharegpt"].model_copy(
        update={"token_budget": 0, "cost_budget_usd": 0, "breaker": Breaker(enabled=breaker)}
    )
    shards = {
        f"{s:05d}": pl.DataFrame({
            "prompt_id": [f"p{s}-{i}" for i in range(SHARD_SIZE)], "dataset": spec.name, "shard": s,
            "messages": [PROMPT] * SHARD_SIZE, "source_id": "bench", "source_row": list(range(SHARD_SIZE)),
        })
        for s in range(n // SHARD_SIZE)
    }  # fmt: skip
    engine = make_engine("openai", base_url=url, model="bench", max_tokens=4096)
    settings = RunnerSettings(max_in_flight=in_flight, initial_in_flight=initial, progress_every=n, progress_bar=False)
    with tempfile.TemporaryDirectory() as root:
        started = time.perf_counter()
        reports = run_generation(engine, spec, shards, ShardStore(root), settings=settings, log=lambda _: None)
        elapsed = time.perf_counter() - started
    ok = sum(r.figures.counts.ok for r in reports.values())
    errors = {k: v for r in reports.values() for k, v in r.figures.counts.errors.items()}
    assert ok == n, f"pipeline finished {ok} of {n} prompts ok ({errors})"
    return n / elapsed, errors


def parse_args(argv: list[str] | None, other: str = "pipeline") -> argparse.Namespace:
    """The load both sides run under (shared with bench_openai_sdk.py, which swaps the client)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2, help=f"alternate bare/{other} runs; best of each")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    n = args.requests // SHARD_SIZE * SHARD_SIZE
    proc, url = start_server(args.latency)
    try:
        bare, pipe, bare_cpu, pipe_cpu, off, off_cpu = [], [], [], [], [], []
        for _ in range(args.rounds):
            cpu = time.process_time()
            bare.append(asyncio.run(bare_loop(url, n, args.in_flight)))
            bare_cpu.append((time.process_time() - cpu) / n * 1e6)
            cpu = time.process_time()
            pipe.append(pipeline(url, n, args.in_flight, args.in_flight)[0])
            pipe_cpu.append((time.process_time() - cpu) / n * 1e6)
            cpu = time.process_time()
            off.append(pipeline(url, n, args.in_flight, args.in_flight, breaker=False)[0])
            off_cpu.append((time.process_time() - cpu) / n * 1e6)
            print(f"bare aiohttp {bare[-1]:.0f} req/s ({bare_cpu[-1]:.0f} us CPU/req), "
                  f"pipeline {pipe[-1]:.0f} req/s ({pipe_cpu[-1]:.0f} us CPU/req), "
                  f"breaker off {off[-1]:.0f} req/s ({off_cpu[-1]:.0f} us CPU/req)", flush=True)  # fmt: skip
        cold, _ = pipeline(url, n, args.in_flight, RunnerSettings().initial_in_flight)
    finally:
        proc.kill()
    ratio = max(pipe) / max(bare)
    print(f"{n} requests, {args.in_flight} in flight, {args.latency:g} s latency, server in its own process")
    print(f"bare aiohttp loop: {max(bare):.0f} req/s (ideal {args.in_flight / args.latency:.0f}), "
          f"client CPU {min(bare_cpu):.0f} us/req")  # fmt: skip
    print(f"pipeline (run_generation, warm start): {max(pipe):.0f} req/s, client CPU {min(pipe_cpu):.0f} us/req")
    print(f"pipeline, cold start from {RunnerSettings().initial_in_flight} in flight: {cold:.0f} req/s "
          f"({cold / max(bare):.2f}x)")  # fmt: skip
    print(f"breaker on vs off: {max(pipe):.0f} vs {max(off):.0f} req/s, client CPU {min(pipe_cpu):.0f} vs "
          f"{min(off_cpu):.0f} us/req")  # fmt: skip
    print(f"RESULT generation_vs_aiohttp {ratio:.3f}")
    print(f"RESULT breaker_overhead {max(pipe) / max(off):.3f}")
    return ratio


@pytest.mark.benchmark
def test_generation_vs_aiohttp() -> None:
    assert main([]) >= 0.9


if __name__ == "__main__":
    main()
