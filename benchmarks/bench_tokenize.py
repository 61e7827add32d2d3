"""Reconstruction + verification + loss-mask throughput against raw `tokenizers` encode_batch.

Both sides get the same multi-turn conversations (text from Python's own library sources, English
prose and CJK, ~1,600 tokens each); raw encodes the rendered texts, ours runs `build_training_rows`.
Thinking is on where the profile's format has reasoning markers (the last reply's reasoning is rendered),
off otherwise. Usage: python benchmarks/bench_tokenize.py [--samples 2000] [--profile qwen3-test] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import sysconfig
import time
from pathlib import Path

import polars as pl

from eagle_data.targets import build_training_rows, load_target

CJK = "深度学习模型的推理速度取决于内存带宽。投机解码用一个小模型先猜后验，大模型一次验证多个词。"


def corpus() -> list[str]:
    """Paragraphs of real text and code: the standard library's sources, split at blank lines."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    chunks = [c for f in files for c in f.read_text(errors="replace").split("\n\n") if len(c) > 80]
    return chunks + [CJK * k for k in range(1, 8)]


def conversations(n: int, seed: int = 0, chars: int = 5000) -> list[list[dict]]:
    """`n` three-round conversations of about `chars` characters; the last reply carries reasoning."""
    rng = random.Random(seed)
    pool = corpus()

    def text(size: int) -> str:
        out = ""
        while len(out) < size:
            out += rng.choice(pool) + "\n\n"
        return out.strip()

    rows = []
    for _ in range(n):
        turns: list[dict] = [{"role": "system", "content": "You are a careful coding assistant."}]
        for r in range(3):
            turns.append({"role": "user", "content": text(chars // 12)})
            reasoning = text(chars // 6) if r == 2 else None
            turns.append({"role": "assistant", "content": text(chars // 6), "reasoning": reasoning})
        rows.append(turns)
    return rows


def frame(convs: list[list[dict]]) -> pl.DataFrame:
    msg = pl.Struct({"role": pl.String, "content": pl.String, "reasoning": pl.String, "output_ids": pl.List(pl.Int32)})
    return pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(len(convs))],
            "dataset": "bench",
            "status": "ok",
            "finish_reason": "stop",
            "messages": pl.Series(convs, dtype=pl.List(msg)),
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--profile", "--target", dest="profile", default="qwen3-test", help="a targets.toml profile")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    target = load_target(args.profile)
    thinking = target.template.has_reasoning
    gens = frame(conversations(args.samples))
    rows = build_training_rows(target, gens, thinking=thinking)  # warm-up; also gives the rendered texts
    texts = target.text_encoder.decode_batch(rows["input_ids"].to_list(), skip_special_tokens=False)
    tokens = int(rows["num_tokens"].sum())
    raw_s, ours_s = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        raw = [e.ids for e in target.tokenizer.encode_batch(texts, add_special_tokens=False)]
        raw_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        rows = build_training_rows(target, gens, thinking=thinking)
        ours_s.append(time.perf_counter() - t)
    ok = rows.select(pl.all_horizontal("roundtrip_ok", "prefix_ok", "structure_ok", "eot_ok").all()).item()
    raw_tps, ours_tps = tokens / min(raw_s), tokens / min(ours_s)
    print(f"samples={args.samples} profile={args.profile} thinking={thinking} tokens={tokens}")
    print(f"raw encode_batch: {min(raw_s):.3f} s  {raw_tps / 1e6:.3f} M tokens/s  ({sum(map(len, raw))} tokens)")
    print(f"build_training_rows: {min(ours_s):.3f} s  {ours_tps / 1e6:.3f} M tokens/s  all checks passed={ok}")
    print(f"RESULT tokenize_vs_raw {ours_tps / raw_tps:.3f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
