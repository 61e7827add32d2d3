"""Hidden-state capture throughput against a bare loop of the same model's forward passes.

Both sides run the demo checkpoint (or --checkpoint) over the same rows in the same length-sorted padded
batches; the bare loop only calls the model with `output_hidden_states=True`, the capture path
(`capture_shard`) also picks the layers, copies them to the CPU, writes every file of the chosen formats
atomically and records progress per batch. Times are process CPU seconds (all threads), the steadier
figure on a shared machine, with one torch thread by default; wall seconds are printed too.
The demo model's forward is cheap (hidden size 64), so what the capture adds shows: the writes into the
page cache (~1 ms CPU per MB) and, for the per-sample formats (specforge, speculators: one torch.save /
safetensors file per row), ~0.3-1 ms CPU per file; with a real target the forward dominates.
Measured 2026-12-01 on the shared 2-core machine (`nice .venv/bin/python benchmarks/bench_capture.py
--formats native`, then specforge, speculators, now named specforge-eagle3, speculators-eagle3): RESULT
capture_vs_raw native 0.77-0.88, specforge
0.82-0.94, speculators 0.79-0.93 over three runs each, the median of a run's 5 paired repeats 0.82-0.95;
capture 35-51 k tokens per CPU-s, the bare loop 38-57 k: a run moves by up to +-0.15 with the machine's
load, so docs/hidden-states.md (Throughput) also times the capture's parts inside one process.
Usage: python benchmarks/bench_capture.py [--rows 300] [--formats native] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from eagle_data.demo import ensure_demo_model
from eagle_data.drafter.capture import TransformersBackend, batches, capture_shard
from eagle_data.drafter.layers import resolve
from eagle_data.drafter.settings import CaptureSettings
from eagle_data.storage import ShardStore


def rows_frame(n: int, seed: int = 0) -> pl.DataFrame:
    """`n` rows of 64-1,024 random ids, the second half of each supervised."""
    rng = random.Random(seed)
    ids = [[rng.randrange(10, 150_000) for _ in range(rng.randint(64, 1024))] for _ in range(n)]
    masks = [[0] * (len(i) // 2) + [1] * (len(i) - len(i) // 2) for i in ids]
    return (
        pl.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "input_ids": ids, "loss_mask": masks})
        .with_row_index("row")
        .cast({"row": pl.Int64})
    )


def bare_loop(backend: TransformersBackend, rows: list[np.ndarray], groups: list[list[int]]) -> None:
    for group in groups:
        longest = max(len(rows[i]) for i in group)
        ids = torch.zeros((len(group), longest), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, i in enumerate(group):
            ids[b, : len(rows[i])] = torch.from_numpy(rows[i].astype(np.int64))
            mask[b, : len(rows[i])] = 1
        with torch.inference_mode():
            backend.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)


def timed(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--formats", default="native", help="comma-separated export targets (trainers.NAMES)")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--batch-tokens", type=int, default=16_384)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both sides (1: steady on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    settings = CaptureSettings(
        formats=tuple(args.formats.split(",")), fp8=args.fp8, dtype="fp32", batch_tokens=args.batch_tokens
    )
    backend = TransformersBackend(Path(args.checkpoint) if args.checkpoint else ensure_demo_model(), "cpu", "fp32")
    plan = resolve(settings, backend.num_layers)
    frame = rows_frame(args.rows)
    rows = [np.asarray(i, dtype=np.int64) for i in frame["input_ids"]]
    groups = batches([len(r) for r in rows], settings.batch_tokens)
    tokens = sum(len(r) for r in rows)
    raw, ours = [], []
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as folder:
        store = ShardStore(folder)
        bare_loop(backend, rows, groups[:1])  # warm-up
        for k in range(args.repeats):
            raw.append(timed(lambda: bare_loop(backend, rows, groups)))
            ours.append(
                timed(lambda k=k: capture_shard(store, f"run{k}", "00000", frame, {}, backend, plan, settings, print))
            )
        written = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) / args.repeats
    raw_cpu, ours_cpu = min(c for c, _ in raw), min(c for c, _ in ours)
    raw_wall, ours_wall = min(w for _, w in raw), min(w for _, w in ours)
    print(f"rows={args.rows} tokens={tokens} batches={len(groups)} formats={args.formats} fp8={args.fp8} "
          f"layers={plan.record()['aux_layers']}+{plan.last} hidden={backend.hidden_size}")  # fmt: skip
    print(f"bare forward loop: {raw_cpu:.2f} CPU-s ({raw_wall:.2f} s wall)  {tokens / raw_cpu:,.0f} tokens/CPU-s")
    print(f"capture_shard:     {ours_cpu:.2f} CPU-s ({ours_wall:.2f} s wall)  {tokens / ours_cpu:,.0f} tokens/CPU-s  "
          f"{written / 1e6:,.1f} MB written")  # fmt: skip
    ratios = sorted(r / o for (r, _), (o, _) in zip(raw, ours, strict=True))
    print(f"spread over {args.repeats} repeats: bare loop {raw_cpu:.2f}-{max(c for c, _ in raw):.2f} CPU-s, capture "
          f"{ours_cpu:.2f}-{max(c for c, _ in ours):.2f} CPU-s; repeat by repeat {ratios[0]:.3f}-{ratios[-1]:.3f} "
          f"(median {ratios[len(ratios) // 2]:.3f})")  # fmt: skip
    print(f"RESULT capture_vs_raw {raw_cpu / ours_cpu:.3f}")


if __name__ == "__main__":
    main()
