"""Budgets on multi-turn data: what a run pays against its token and dollar budgets at 2,000 in flight.

Each configuration (1, 4 and 8 user turns per conversation; a dollar budget, then a token budget) runs the
whole `run_generation` call against the fake OpenAI-compatible server in its own process (0.2-0.3 s latency,
replies of 20-60 tokens under a 64-token cap, $1e-4 a token, its `cost` reported in the usage). The spend is
counted at the server: every token it billed. The baseline is the budget itself: a ratio over 1 is an overshoot.

    python benchmarks/bench_budget.py [--in-flight 2000] [--turns 1 4 8]
    pytest benchmarks/bench_budget.py -m benchmark
Last line: `RESULT budget_overshoot <worst spend / budget>` (target <= 1.02).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from eagle_data.catalog import Breaker
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.standins.openai_fake import prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore

COST_PER_TOKEN = 1e-4
FAULTS = {"latency_s": 0.2, "latency_jitter_s": 0.1, "reply_tokens": [20, 60], "cost_per_token": COST_PER_TOKEN}
USD_BUDGET, TOKEN_BUDGET = 15.0, 150_000


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle_data.standins.openai_fake", "--faults", json.dumps(FAULTS)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}"


def spent(turns: int, in_flight: int, **budget: float) -> tuple[float, int]:
    """(USD, tokens) the server billed for one run under `budget`, on 4,000 conversations of `turns` turns."""
    proc, url = start_server()
    try:
        engine = make_engine("openai", base_url=f"{url}/v1", model="m", max_tokens=64)
        settings = RunnerSettings(max_in_flight=in_flight, initial_in_flight=in_flight, progress_bar=False)
        spec = spec_for_tests(breaker=Breaker(enabled=False), **budget)
        with tempfile.TemporaryDirectory() as root:
            run_generation(engine, spec, prompt_shards(2, 2000, turns=turns), ShardStore(root), settings=settings,
                           log=lambda _: None)  # fmt: skip
        with urllib.request.urlopen(f"{url}/_stats") as answer:
            usd = float(json.load(answer)["billed_usd"])
    finally:
        proc.kill()
    return usd, round(usd / COST_PER_TOKEN)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args(argv)
    worst = 0.0
    for turns in args.turns:
        usd, _ = spent(turns, args.in_flight, cost_budget_usd=USD_BUDGET)
        _, tokens = spent(turns, args.in_flight, token_budget=TOKEN_BUDGET)
        worst = max(worst, usd / USD_BUDGET, tokens / TOKEN_BUDGET)
        print(f"{turns} turn(s), {args.in_flight} in flight: ${usd:.2f} of ${USD_BUDGET:g} "
              f"({usd / USD_BUDGET:.3f}x), {tokens:,} of {TOKEN_BUDGET:,} tokens ({tokens / TOKEN_BUDGET:.3f}x)",
              flush=True)  # fmt: skip
    print(f"RESULT budget_overshoot {worst:.3f}")
    return worst


@pytest.mark.benchmark
def test_budget_overshoot() -> None:
    assert main([]) <= 1.02


if __name__ == "__main__":
    main()
