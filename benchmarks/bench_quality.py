"""Cost of the quality gates (verdicts, every check, report figures) against reading the shard they judge.

A check must read its validated shard from Parquet anyway; this measures what the gates add on top.
The shard is synthetic but shaped like a real one: `--rows` rows of ~`--tokens` tokens (ids and loss
mask), replies of varied length, 2% truncated, 1% failed.
Usage: python benchmarks/bench_quality.py [--rows 500] [--tokens 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import random
import time

import polars as pl

from eagle_data.catalog import Checks
from eagle_data.quality import Inputs, figures, row_verdicts, run_checks

VOCAB = range(151_643)
SENTENCE = "the draft model proposes tokens and the target model verifies them in one pass"


def shard(rows: int, tokens: int, seed: int = 0) -> pl.DataFrame:
    rng = random.Random(seed)
    status = ["failed" if i % 100 == 7 else "truncated" if i % 50 == 3 else "ok" for i in range(rows)]
    lengths = [0 if s == "failed" else rng.randint(tokens // 4, tokens * 2) for s in status]
    words = SENTENCE.split()
    return pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(rows)],
            "dataset": "bench",
            "status": status,
            "finish_reason": [{"ok": "stop", "truncated": "length"}.get(s, "") for s in status],
            "content": [" ".join(rng.choices(words, k=n // 2)) for n in lengths],
            "reasoning": [" ".join(rng.choices(words, k=n // 2)) for n in lengths],
            "completion_tokens": lengths,
            "input_ids": [rng.choices(VOCAB, k=n + 200) for n in lengths],  # incompressible, like real ids
            "loss_mask": [[0] * 200 + [1] * n for n in lengths],
            "num_tokens": [n + 200 for n in lengths],
            "loss_tokens": lengths,
            "roundtrip_ok": [s != "failed" or None for s in status],
            "prefix_ok": [s != "failed" or None for s in status],
            "structure_ok": [s != "failed" or None for s in status],
            "special_in_text": 0,
            "eot_ok": [s == "ok" if s != "failed" else None for s in status],
            "ids_match": None,
            "target_error": "",
        },
        schema_overrides={"input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8), "ids_match": pl.Boolean},
    )


def best_of(repeats: int, fn: object) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    frame, checks = shard(args.rows, args.tokens), Checks()
    buf = io.BytesIO()
    frame.write_parquet(buf, compression="zstd")
    data = buf.getvalue()

    def gates() -> None:
        verdicted = row_verdicts(pl.read_parquet(io.BytesIO(data)), checks, True)
        run_checks(verdicted, Inputs(checks, True, 1000.0))
        figures(verdicted, checks)

    read = best_of(args.repeats, lambda: pl.read_parquet(io.BytesIO(data)))
    ours = best_of(args.repeats, gates)
    tokens = int(frame["num_tokens"].sum())
    print(f"shard: {args.rows} rows, {tokens:,} tokens, {len(data) / 1e6:.1f} MB parquet")
    print(f"baseline  read parquet                    {read * 1e3:8.1f} ms")
    print(f"ours      read + verdicts + checks + figures {ours * 1e3:6.1f} ms ({args.rows / ours:,.0f} rows/s)")
    print(f"RESULT quality_gates {ours / read:.2f}")


if __name__ == "__main__":
    main()
