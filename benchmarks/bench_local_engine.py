"""The embedded engine against one bare batched `model.generate`, in tokens per CPU-second, on a real model.

SmolLM2-135M-Instruct (`eagle_data.demo.ensure_smollm2`, converted once into the cache) answers the same
prompts both ways, in the same process and the same run, on the same loaded weights and thread
count, greedily by default (or sampled: --temperature, --top-p):
- the engine: `LocalEngine.complete` for every prompt at once (asyncio.gather, as the runner calls it), so
  its worker gathers them into batches of `--batch`;
- the baseline: the prompts rendered by the same chat template, left-padded into batches of `--batch`, one
  `model.generate` each (greedy, the same max_new_tokens).
Tokens are each reply's ids through its end-of-turn id, counted the same way on both sides (greedy: the ids
must be the same, and the script says how many rows differ; sampled, `generate` draws from torch's generator
and the engine from each row's own, so the replies, and their lengths, differ). CPU time is the process's
(every thread), which a shared machine disturbs less than wall time. Rounds alternate baseline and engine; the ratio is
over their totals.

    python benchmarks/bench_local_engine.py [--prompts 16] [--batch 16] [--max-tokens 64] [--threads 1] [--rounds 2]
        [--temperature 0] [--top-p 1]

Last line: `RESULT local_engine_vs_generate <engine tokens per CPU-s / generate's>` (floor 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

QUESTIONS = (
    "What is the capital of France?", "Write a haiku about compilers.", "Explain recursion in one sentence.",
    "List three fruits and their colours.", "What is 17 times 3?", "Name a famous painter and one painting.",
    "Why is the sky blue?", "Say hello in three languages.", "What does a compiler do?",
    "Give me a tip for learning to cook.", "What is photosynthesis?", "Describe a cat in two sentences.",
    "How many days are in a leap year?", "What is the boiling point of water?", "Suggest a name for a dog.",
    "What is a prime number?",
)  # fmt: skip


def reply_ids(ids: list[int], end: int, max_tokens: int) -> list[int]:
    """A reply's ids through its first end id, at most max_tokens: what the engine returns."""
    ids = ids[:max_tokens]
    return ids[: ids.index(end) + 1] if end in ids else ids


def bare_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0
) -> list[list[int]]:
    """One left-padded `model.generate` over `prompts`: greedy, or sampled at `temperature` and `top_p` (and the
    checkpoint's top-k) by transformers' own sampler."""
    import torch

    pad, end = tokenizer.pad_token_id, tokenizer.eos_token_id
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, pad_token_id=pad,
            **(dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature else dict(do_sample=False)),
        )  # fmt: skip
    return [reply_ids(row, end, max_tokens) for row in out[:, width:].tolist()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()

    import torch

    from eagle_data.catalog import Generation
    from eagle_data.demo import ensure_smollm2
    from eagle_data.engines.local import LocalEngine

    generation = Generation(max_tokens=args.max_tokens, min_tokens=0, temperature=args.temperature, top_p=args.top_p,
                            thinking=False)  # fmt: skip
    engine = LocalEngine(ensure_smollm2(), generation, batch_size=args.batch, threads=args.threads)
    tokenizer, model = engine._load()
    chats = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(args.prompts)]
    prompts = [list(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=True)
                    ["input_ids"]) for c in chats]  # fmt: skip

    def baseline() -> list[list[int]]:
        torch.set_num_threads(args.threads)
        batches = [prompts[i : i + args.batch] for i in range(0, len(prompts), args.batch)]
        sampling = args.max_tokens, args.temperature, args.top_p
        return [ids for batch in batches for ids in bare_generate(model, tokenizer, batch, *sampling)]

    def through_engine() -> list[list[int]]:
        async def all_at_once() -> list[Any]:
            return await asyncio.gather(*(engine.complete(c, prompt_id=f"p{i}") for i, c in enumerate(chats)))

        return [done.output_ids for done in asyncio.run(all_at_once())]

    bare_generate(model, tokenizer, prompts[:2], 2)  # first-call costs out of both measurements
    totals = {"generate": [0, 0.0, 0.0], "engine": [0, 0.0, 0.0]}  # tokens, CPU s, wall s
    differ = 0
    for _ in range(args.rounds):
        outputs = {}
        for name, run in (("generate", baseline), ("engine", through_engine)):
            cpu, wall = time.process_time(), time.monotonic()
            outputs[name] = run()
            totals[name][1] += time.process_time() - cpu
            totals[name][2] += time.monotonic() - wall
            totals[name][0] += sum(map(len, outputs[name]))
        differ += sum(a != b for a, b in zip(outputs["generate"], outputs["engine"], strict=True))
    rate = {}
    for name, (tokens, cpu, wall) in totals.items():
        rate[name] = tokens / cpu
        print(f"{name}: {tokens} tokens, {cpu:.1f} CPU-s, {wall:.1f} s: {rate[name]:.1f} tokens per CPU-s, "
              f"{tokens / wall:.1f} tokens/s")  # fmt: skip
    sampling = f"T {args.temperature}, top_p {args.top_p}" if args.temperature else "greedy"
    print(f"{args.prompts} prompts x {args.rounds} rounds, batch {args.batch}, max_tokens {args.max_tokens}, "
          f"{sampling}, "
          f"{args.threads} thread(s); rows whose ids differ: {differ if not args.temperature else 'n/a (sampled)'}; "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"RESULT local_engine_vs_generate {rate['engine'] / rate['generate']:.3f}")


if __name__ == "__main__":
    main()
