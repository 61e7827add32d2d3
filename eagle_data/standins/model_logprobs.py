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


def sglang_logprobs(path: str, input_ids: list[int], output_ids: list[int], start: int, k: int) -> dict[str, Any]:
    """SGLang's `meta_info` logprob fields for one `/generate` request (return_text_in_logprobs off: each text
    null): from `start` (-1: the output tokens only) one `[logprob, id, null]` per token, the first without a
    value, and with `k` the k most likely at each."""
    start = len(input_ids) - 1 if start < 0 else start
    ids = [*input_ids, *output_ids]
    rows = logprobs(path, ids)

    def entry(t: int) -> list[Any]:
        return [float(rows[t, ids[t]]), ids[t], None]

    def tops(t: int) -> list[list[Any]]:
        return [[v, i, None] for v, i in top(rows[t], k)]

    inputs, outputs = range(start + 1, len(input_ids)), range(len(input_ids), len(ids))
    out = {
        "input_token_logprobs": [[None, ids[start], None], *map(entry, inputs)],
        "output_token_logprobs": [entry(t) for t in outputs],
    }
    if k:
        out |= {"input_top_logprobs": [None, *map(tops, inputs)], "output_top_logprobs": [tops(t) for t in outputs]}
    return out


def vllm_prompt_logprobs(path: str, ids: list[int], k: int) -> list[dict[str, Any] | None]:
    """vLLM's `choices[0].prompt_logprobs`: per prompt token (the first null) a dict of token id -> {logprob, rank,
    decoded_token} holding the token there and the k most likely."""
    rows = logprobs(path, ids)
    listed: list[dict[str, Any] | None] = [None]
    for t in range(1, len(ids)):
        entries = {i: lp for lp, i in top(rows[t], k)} | {ids[t]: float(rows[t, ids[t]])}
        listed.append(
            {str(i): {"logprob": lp, "rank": rank(rows[t], i), "decoded_token": None} for i, lp in entries.items()}
        )
    return listed


@cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def vllm_chat_logprobs(path: str, prompt_ids: list[int], reply_ids: list[int], k: int) -> list[dict[str, Any]]:
    """vLLM's chat `choices[0].logprobs.content` for a reply: per reply token its text, log-probability and bytes,
    and `top_logprobs` as vLLM lists them, the sampled token first, then the most likely others, k in all
    (`_make_logprob_dict` in vllm/v1/engine/logprobs.py, `_get_top_logprobs` of its chat serving)."""
    ids, decode = [*prompt_ids, *reply_ids], _tokenizer(path).decode
    rows = logprobs(path, ids)

    def entry(t: int, token: int) -> dict[str, Any]:
        text = decode([token])
        return {"token": text, "logprob": float(rows[t, token]), "bytes": list(text.encode())}

    out = []
    for t in range(len(prompt_ids), len(ids)):
        others = [i for _, i in top(rows[t], k) if i != ids[t]]
        out.append({**entry(t, ids[t]), "top_logprobs": [entry(t, i) for i in [ids[t], *others][:k]]})
    return out
