"""The on-policy score on a real instruct model (SmolLM2-135M-Instruct): which data the target calls its own,
what the `on_policy` check says of each set, and what scoring costs.

Sets (the same prompts from the bundled b3_magicoder sample):
- greedy / T=0.8: the model's own replies, rows built with its chat template;
- original: the sample's original answers; ok: "OK." for every prompt;
- no_system: the greedy replies under a prompt rendered without the template's default system turn;
- thinking: the random-weight Qwen3 stand-in (the only local model with a think template): its greedy replies
  generated with thinking off, rendered with thinking on (the empty think block supervised), beside the same
  replies rendered as generated (thinking_matched).

Cost: process CPU seconds of the in-process scorer (base model + LM head on supervised positions, top-k, the
tempered normalizer) against a bare loop of the same model's forward passes (`model(input_ids)`, logits at every
position) over the same rows in the same batches, one torch thread, best of 3 each, alternated. Capture: CPU of
`capture_shard` on the greedy rows with every row scored against none (the default scores 8 rows of a 2,000-row
shard; the line says what that implies).

    python benchmarks/bench_on_policy.py [--prompts 12] [--tokens 32]

Ends with `RESULT on_policy_vs_forward <bare CPU / scorer CPU>` (floor 0.9).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import polars as pl
import torch

from eagle_data.drafter.capture import TransformersBackend, capture_shard
from eagle_data.drafter.layers import resolve
from eagle_data.drafter.settings import CaptureSettings
from eagle_data.engines.local import _checkpoint, _fingerprint
from eagle_data.engines.scoring import Row, TargetIds, TransformersScorer, padded_batches, score_rows
from eagle_data.quality import on_policy as op
from eagle_data.standins import model_rows as smol_rows
from eagle_data.standins.random_model import ensure_random_model
from eagle_data.storage import ShardStore

GREEDY, SAMPLED = op.SamplingPoint(0.0), op.SamplingPoint(0.8, 0.95)
DEFAULT_CAPTURE_SHARE = 8 / 2000  # [drafter.capture] on_policy_rows over shard_rows


def cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def thinking_sets(prompts: list[str], tokens: int) -> dict[str, tuple[list[Row], TargetIds]]:
    """The random Qwen3 stand-in's greedy replies with thinking off, rendered as generated and with thinking on."""
    folder = ensure_random_model().resolve()
    tokenizer, model = _checkpoint(folder, "cpu", _fingerprint(folder))
    think = tuple(tokenizer.convert_tokens_to_ids(["<think>", "</think>"]))
    ids = TargetIds(len(tokenizer), tokenizer.eos_token_id, think)  # type: ignore[arg-type]
    matched, mismatched = [], []
    for text in prompts:
        chat = [{"role": "user", "content": text}]
        off = list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, enable_thinking=False)["input_ids"])
        on = list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, enable_thinking=True)["input_ids"])
        with torch.no_grad():
            made = model.generate(torch.tensor([off]), max_new_tokens=tokens, do_sample=False, pad_token_id=0)
        reply = made[0, len(off) :].tolist()
        assert off[: len(on)] == on, "the thinking-off prompt is the thinking-on prompt plus an empty think block"
        matched.append(Row(off + reply, [0] * len(off) + [1] * len(reply), GREEDY))
        mismatched.append(Row(off + reply, [0] * len(on) + [1] * (len(off) - len(on) + len(reply)), GREEDY))
    return {"thinking_matched": (matched, ids), "thinking": (mismatched, ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    smol = smol_rows.load_smol()
    items = smol_rows.sample_prompts(args.prompts)
    prompts = [smol_rows.prompt_ids(smol, text) for text, _ in items]
    bare = [smol_rows.prompt_ids(smol, text, system=False) for text, _ in items]
    started = time.perf_counter()
    greedy = smol_rows.generate(smol, prompts, 0.0, 1.0, args.tokens)
    sampled = smol_rows.generate(smol, prompts, SAMPLED.temperature, SAMPLED.top_p, args.tokens, seed=1)
    print(f"generated {2 * len(prompts)} replies in {time.perf_counter() - started:.0f} s")
    sets: dict[str, tuple[list[Row], TargetIds]] = {
        "greedy": (smol_rows.rows(prompts, greedy, GREEDY), smol.ids),
        "T=0.8": (smol_rows.rows(prompts, sampled, SAMPLED), smol.ids),
        "original": (smol_rows.rows(prompts, [smol_rows.text_reply(smol, a) for _, a in items], GREEDY), smol.ids),
        "ok": (smol_rows.rows(prompts, [smol_rows.text_reply(smol, "OK.")] * len(prompts), GREEDY), smol.ids),
        "no_system": (smol_rows.rows(bare, greedy, GREEDY), smol.ids),
        **thinking_sets([text for text, _ in items], args.tokens),
    }
    print(f"{'set':17} {'rows':>4} {'tokens':>6} {'agree':>6} {'expect':>6} {'logp':>7} {'expect':>7}  verdict")
    for name, (rows, ids) in sets.items():
        scorer = TransformersScorer(smol.folder if ids == smol.ids else ensure_random_model())
        t = op.totals(score_rows(rows, scorer, ids, 20))
        v = op.judge(t, op.Limits())
        said = "pass" if v.passed else f"FAIL {v.cause}"
        print(f"{name:17} {t.rows:4} {int(t.get('tokens')):6} {t.agreement:6.3f} {t.expected_agreement:6.3f} "
              f"{t.mean_logprob:7.3f} {t.expected_logprob:7.3f}  {said}")  # fmt: skip
    rows = sets["T=0.8"][0] + sets["greedy"][0]
    tokens = sum(len(r.input_ids) for r in rows)
    scorer, model = TransformersScorer(smol.folder), smol.model

    def forward_loop() -> None:
        for _, ids, mask in padded_batches(rows, scorer.batch_tokens):  # the scorer's own batches, padded alike
            with torch.inference_mode():
                model(input_ids=ids, attention_mask=mask)

    bare_s, scorer_s = [], []
    for _ in range(3):
        bare_s.append(cpu(forward_loop))
        scorer_s.append(cpu(lambda: scorer.score(rows, 20)))
    print(f"cost per 1,000 tokens ({tokens:,} tokens, {len(rows)} rows): bare forward "
          f"{1000 * min(bare_s) / tokens:.3f} CPU-s, scorer {1000 * min(scorer_s) / tokens:.3f} CPU-s")  # fmt: skip
    greedy_rows = sets["greedy"][0]
    frame = pl.DataFrame(
        {"row": list(range(len(greedy_rows))), "prompt_id": [f"p{i}" for i in range(len(greedy_rows))],
         "input_ids": [list(r.input_ids) for r in greedy_rows], "loss_mask": [list(r.loss_mask) for r in greedy_rows]},
        schema_overrides={"row": pl.Int64, "input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8)},
    )  # fmt: skip
    backend = TransformersBackend(smol.folder, "cpu", "fp32")

    def capture(score_rows_: int) -> float:
        settings = CaptureSettings(formats=("native",), dtype="fp32", on_policy_rows=score_rows_)
        with tempfile.TemporaryDirectory() as root:
            return cpu(lambda: capture_shard(ShardStore(root), "cid", "00000", frame, {"formats": ["native"]},
                                             backend, resolve(settings, backend.num_layers), settings,
                                             lambda _: None, smol.ids))  # fmt: skip

    without, scored = [], []
    for _ in range(3):
        without.append(capture(0))
        scored.append(capture(len(greedy_rows)))
    overhead = min(scored) / min(without) - 1
    print(f"capture CPU: {min(without):.3f} s without figures, {min(scored):.3f} s with every row scored "
          f"(+{overhead:.1%}); at the default share of scored rows ({DEFAULT_CAPTURE_SHARE:.1%}) that is "
          f"+{overhead * DEFAULT_CAPTURE_SHARE:.3%}")  # fmt: skip
    print(f"RESULT on_policy_vs_forward {min(bare_s) / min(scorer_s):.3f}")


if __name__ == "__main__":
    main()
