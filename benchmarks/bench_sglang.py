"""SGLang engine (fleet dispatch, ChatML ids, decode) vs a bare aiohttp loop, same stand-in servers, same run.

Three stand-in SGLang servers in their own processes, each answering /generate after `--latency`
seconds; both sides keep `--in-flight` requests per server in flight. The bare loop posts
precomputed input_ids round-robin and parses JSON; the engine also builds the ids with the real Qwen
vocabulary, picks the least-loaded server, decodes and splits reasoning. A third figure kills one of
the three servers a quarter of the way in: the engine finishes every request on the other two.

    python benchmarks/bench_sglang.py [--requests 6000] [--in-flight 200] [--latency 0.5]
    pytest benchmarks/bench_sglang.py -m benchmark
Last line: `RESULT sglang_engine_vs_aiohttp <ratio>` (target >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from itertools import cycle
from pathlib import Path

import aiohttp
import pytest

from eagle_data.engines.launcher import LaunchConfig, Launcher
from eagle_data.engines.sglang import Codec, SGLangEngine, SGLangSettings
from eagle_data.standins.sglang_fake import THINK_END, THINK_START, free_port_block
from eagle_data.targets.reasoning import ReasoningMarkers
from eagle_data.targets.vocab import qwen_tokenizer
from eagle_data.types import Message

REPO = Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3-8B"
MAX_NEW_TOKENS = 64


def conversation(i: int) -> list[Message]:
    return [{"role": "user", "content": f"Explain speculative decoding, variant {i}."}]


def chatml_ids(messages: list[Message], thinking: bool) -> list[int]:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    text += "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
    return qwen_tokenizer().encode(text, add_special_tokens=False).ids


async def bare_loop(urls: list[str], n: int, in_flight: int) -> float:
    """The baseline: one session, a semaphore, round-robin POST of precomputed ids. Returns req/s."""
    sem = asyncio.Semaphore(in_flight * len(urls))
    bodies = [{"input_ids": chatml_ids(conversation(i), True),
               "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS}} for i in range(n)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(url: str, body: dict[str, object]) -> None:
            async with sem, session.post(url + "/generate", json=body) as resp:
                await resp.json()

        started = time.perf_counter()
        await asyncio.gather(*(one(u, b) for u, b in zip(cycle(urls), bodies, strict=False)))
        return n / (time.perf_counter() - started)


async def engine_loop(launcher: Launcher, n: int, in_flight: int, kill: bool) -> tuple[float, int]:
    """The engine over n prompts; with `kill`, SIGKILL one server a quarter in. Returns (req/s, failovers)."""
    tok = qwen_tokenizer()
    markers = ReasoningMarkers("<think>", "</think>", THINK_START, THINK_END)
    codec = Codec(chatml_ids, lambda ids: tok.decode(ids, skip_special_tokens=False), markers)
    settings = SGLangSettings(urls=tuple(launcher.urls), model=MODEL, max_new_tokens=MAX_NEW_TOKENS,
                              max_in_flight_per_server=in_flight, reprobe_s=3600)
    engine = SGLangEngine(settings, codec)
    await engine.start()
    started = time.perf_counter()
    tasks = [asyncio.create_task(engine.complete(conversation(i), prompt_id=f"p{i}")) for i in range(n)]
    if kill:
        while sum(t.done() for t in tasks) < n // 4:
            await asyncio.sleep(0.01)
        os.killpg(launcher.servers[1].process.pid, signal.SIGKILL)
    results = await asyncio.gather(*tasks)
    rate = n / (time.perf_counter() - started)
    failovers = engine.stats()["failovers"]
    await engine.aclose()
    assert len(results) == n and all(r.output_ids for r in results)
    return rate, failovers


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--in-flight", type=int, default=200, help="per server")
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=2, help="alternate bare/engine runs; best of each")
    args = parser.parse_args(argv)
    qwen_tokenizer()  # built once, outside the timings
    with tempfile.TemporaryDirectory() as logs:
        config = LaunchConfig(
            model_path=MODEL, num_servers=3, base_port=free_port_block(3), log_dir=logs,
            command=(sys.executable, "-m", "eagle_data.standins.sglang_fake"),
            extra_args=("--delay", str(args.latency)), env={"PYTHONPATH": str(REPO)}, health_timeout_s=30,
        )
        bare, eng = [], []
        with Launcher(config) as launcher:
            for _ in range(args.rounds):
                bare.append(asyncio.run(bare_loop(launcher.urls, args.requests, args.in_flight)))
                eng.append(asyncio.run(engine_loop(launcher, args.requests, args.in_flight, kill=False))[0])
                print(f"bare aiohttp {bare[-1]:.0f} req/s, engine {eng[-1]:.0f} req/s", flush=True)
            killed, failovers = asyncio.run(engine_loop(launcher, args.requests, args.in_flight, kill=True))
    ratio = max(eng) / max(bare)
    ideal = 3 * args.in_flight / args.latency
    print(f"{args.requests} requests, 3 servers x {args.in_flight} in flight, {args.latency:g} s latency")
    print(f"bare aiohttp loop: {max(bare):.0f} req/s (ideal {ideal:.0f})")
    print(f"SGLang engine: {max(eng):.0f} req/s")
    print(f"SGLang engine, one of 3 servers SIGKILLed a quarter in: {killed:.0f} req/s "
          f"({killed / max(bare):.2f}x), {failovers} requests re-sent, all {args.requests} answered")
    print(f"RESULT sglang_engine_vs_aiohttp {ratio:.3f}")
    return ratio


@pytest.mark.benchmark
def test_sglang_engine_vs_aiohttp() -> None:
    assert main([]) >= 0.9


if __name__ == "__main__":
    main()
