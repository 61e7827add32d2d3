"""A real model inside a stand-in server: the log-probabilities SGLang's `return_logprob` and vLLM's
`prompt_logprobs` report, computed with transformers (fp32, one thread) from a checkpoint folder, so a test
of a scorer reads real values in each engine's own response format (sglang_fake.py, openai_fake.py)."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _load(path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def logprobs(path: str, ids: list[int]) -> Any:
    """[len(ids), vocab]: row t is the distribution that predicts token t (row 0, which nothing predicts, is
    the distribution after the first token and is never read as token 0's)."""
    import torch

    with torch.inference_mode():
        logits = _load(path)(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(torch.cat([logits[:1], logits[:-1]]), dim=-1)


def greedy(path: str, ids: list[int], max_new_tokens: int) -> tuple[list[int], dict[str, Any]]:
    """The model's own greedy reply (up to its end-of-turn id) and SGLang's finish_reason for it."""
    import torch

    model = _load(path)
    eos = model.generation_config.eos_token_id
    with torch.inference_mode():
        made = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=eos)
    reply = made[0, len(ids) :].tolist()
    if reply and reply[-1] == eos:
        return reply, {"type": "stop", "matched": eos}
    return reply, {"type": "length", "length": max_new_tokens}


def top(row: Any, k: int) -> list[tuple[float, int]]:
    """The k most likely (logprob, id) of one distribution row, most likely first."""
    import torch

    values, indices = torch.topk(row, k)
    return [(float(v), int(i)) for v, i in zip(values, indices, strict=True)]


def rank(row: Any, token: int) -> int:
    """vLLM's rank of a token: 1 for the most likely."""
    return int((row > row[token]).sum()) + 1
