"""One left-padded `generate` over many requests, each keeping what it would get alone: its own min/max tokens,
temperature, top-k and top-p, and a draw from its own seeded generator (the local engine's batches); where a
request asks, its tokens' own log-probabilities and ranks, read from the logits it samples from (no second pass)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_data.quality import sampled
from eagle_data.types import SampledLogprobs

TOP_K = 50  # a sampled row's top-k where the checkpoint's generation config sets none: transformers' default
# (`GenerationConfig._get_default_generation_params`), which `generate` applied when it sampled itself


@dataclass
class Row:
    """One request in a batch: its prompt ids, sampling and generator (None when greedy); `top_logprobs`: the k
    its tokens' ranks are capped by (quality/sampled.py), 0 when it asks for no log-probabilities."""

    prompt: list[int]
    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    generator: Any
    top_logprobs: int = 0


def end_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a reply: the checkpoint's generation config's end ids, else its tokenizer's."""
    ends = model.generation_config.eos_token_id
    ends = tokenizer.eos_token_id if ends is None else ends
    return [ends] if isinstance(ends, int) else list(ends)


def generate_rows(
    model: Any, tokenizer: Any, rows: list[Row], each_step: Callable[[], None] | None = None
) -> list[tuple[list[int], SampledLogprobs | None]]:
    """Left-padded `generate` over every row; each row's output ids, through its first end id (kept) or its own
    max_tokens, with their figures where the row asks (else None). Decoding is greedy: a sampled row's token
    is drawn by `_RowSampler`, which leaves only that token standing.

    Once half the rows in a call have ended, the call stops and the rest go on without them (`_RowLengths`):
    the cache keeps only their rows, and the next call starts from it, one token in. `generate` would compute
    a finished row until the batch's longest reply ended (the demo's batches ran on for 250 steps after most
    of their replies had ended, for the 2 or 3 that looped to the token cap). `each_step` runs before every
    step after the first (the engine's thread count follows the machine's load)."""
    import torch
    from transformers import LogitsProcessorList, StoppingCriteriaList

    ends = end_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]
    width = max(len(row.prompt) for row in rows)
    device = model.device
    input_ids = torch.tensor([[pad] * (width - len(r.prompt)) + r.prompt for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in rows], device=device)
    config = copy.deepcopy(model.generation_config)  # its other settings (a repetition penalty) apply as before
    config.do_sample, config.temperature, config.top_p, config.top_k = False, None, None, None  # `_RowSampler`'s
    config.min_new_tokens = None  # each row's own, in `_RowSampler`
    config.pad_token_id, config.eos_token_id = pad, ends
    sampler = _RowSampler(rows, width, ends, model.generation_config.top_k)
    cache = _cache(model, width + max(r.max_tokens for r in rows))
    outputs: list[list[int]] = [[] for _ in rows]
    with torch.no_grad():
        while sampler.alive:
            config.max_new_tokens = max(rows[i].max_tokens for i in sampler.alive) - (input_ids.shape[1] - width)
            lengths = _RowLengths([rows[i] for i in sampler.alive], width, ends, each_step)
            sampler.ended = lengths.ended
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                generation_config=config,
                cache=cache,
                logits_processor=LogitsProcessorList([sampler]),
                stopping_criteria=StoppingCriteriaList([lengths]),
            )
            ended = lengths.ended.tolist()
            for at, i in enumerate(sampler.alive):
                if ended[at]:  # every row ends in some call: the loop stops when none is going
                    outputs[i] = out[at, width:].tolist()
            going = [at for at, done in enumerate(ended) if not done]
            if going:
                cache.batch_select_indices(torch.tensor(going, device=device))
                grown = out.shape[1] - mask.shape[1]
                input_ids, mask = out[going], torch.cat([mask[going], mask.new_ones(len(going), grown)], dim=1)
            sampler.alive = [sampler.alive[at] for at in going]
    replies = []
    for i, (row, ids) in enumerate(zip(rows, outputs, strict=True)):
        ids = ids[: row.max_tokens]
        end = next((at for at, token in enumerate(ids) if token in ends), None)
        ids = ids if end is None else ids[: end + 1]
        replies.append((ids, sampler.figures(i, len(ids)) if row.top_logprobs else None))
    return replies


def _cache(model: Any, length: int) -> Any:
    """transformers' own dynamic cache, each full-attention layer writing its keys and values into one buffer
    of the batch's final `length`: the default layer concatenates them per token, copying the whole cache
    each time (53 of 242 profiled seconds of SmolLM2 answering 16 of the demo's prompts). The layer
    returns the same values in the same shapes, as views of its buffer, and keeps only the rows
    `generate_rows` goes on with; it never crops, and sliding-window and other layers stay as they are."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class BufferedLayer(DynamicLayer):
        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.buffers = [
                    states.new_empty(*states.shape[:2], length, states.shape[-1])
                    for states in (key_states, value_states)
                ]
            start = self.get_seq_length()
            end = start + key_states.shape[-2]
            for buffer, states in zip(self.buffers, (key_states, value_states), strict=True):
                buffer[..., start:end, :] = states
            self.keys, self.values = (buffer[..., :end, :] for buffer in self.buffers)
            return self.keys, self.values

        def batch_select_indices(self, indices: Any) -> None:
            if self.is_initialized:
                end = self.get_seq_length()
                kept = [buffer.new_empty(len(indices), *buffer.shape[1:]) for buffer in self.buffers]
                for new, buffer in zip(kept, self.buffers, strict=True):
                    new[..., :end, :] = buffer[indices, ..., :end, :]
                self.buffers = kept
                self.keys, self.values = (buffer[..., :end, :] for buffer in self.buffers)

    cache = DynamicCache(config=model.config)
    cache.layers = [BufferedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def checkpoint_top_k(folder: Path) -> int:
    """The top-k a sampled row is cut to: the checkpoint's generation_config.json `top_k`, else TOP_K (0: off)."""
    config = folder / "generation_config.json"
    top_k = json.loads(config.read_text()).get("top_k") if config.is_file() else None
    return TOP_K if top_k is None else int(top_k)


class _RowSampler:
    """Each row's min_tokens (its end ids barred before), then, for a sampled row, what `generate` does when it
    samples that row alone (its temperature, the checkpoint's top-k, its top-p: transformers' own warpers, in
    their order) and one draw from the row's own generator, where `generate` draws from torch's, seeded the
    same: the drawn token alone is left standing for the greedy pick. So a row's tokens depend only on its own
    logits and seed, never on the rows beside it, and equal those of one `generate` seeded with its seed.

    A row that asks for log-probabilities also keeps, per step, its token's log-probability and rank under the
    scores as they arrive (T = 1, before its min_tokens barring and warping: vLLM's raw logprobs), where its
    token is the drawn one, or for a greedy row the argmax `generate` takes after the barring. Kept as tensors,
    read once at the end: no device sync per step."""

    def __init__(self, rows: list[Row], start: int, ends: list[int], top_k: int | None) -> None:
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.rows, self.start, self.ends = rows, start, ends
        self.alive = list(range(len(rows)))  # the row at each place of the batch `generate` is given now
        self.ended: Any = None  # per place, ended or at its max_tokens (this call's `_RowLengths`)
        self.logprobs: list[list[Any]] = [[] for _ in rows]  # per row, per step: a 0-d tensor (asking rows only)
        self.ranks: list[list[Any]] = [[] for _ in rows]
        top_k = TOP_K if top_k is None else top_k
        self.warpers = [
            LogitsProcessorList(
                ([TemperatureLogitsWarper(row.temperature)] if row.temperature != 1.0 else [])
                + ([TopKLogitsWarper(top_k)] if top_k else [])  # 0: the checkpoint turns top-k off
            )
            if row.temperature > 0
            else None  # greedy
            for row in rows
        ]
        self.nucleus = [TopPLogitsWarper(row.top_p) if row.temperature > 0 and row.top_p < 1.0 else None
                        for row in rows]  # fmt: skip

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        step = input_ids.shape[1] - self.start
        for at, i in enumerate(self.alive):
            row = self.rows[i]
            if self.ended is not None and self.ended[at]:  # its draws never reach its reply: no sampling work
                continue
            raw = scores[at].clone() if row.top_logprobs else None  # barring and the draw below write into scores
            if step < row.min_tokens:
                scores[at, self.ends] = -float("inf")
            if (warpers := self.warpers[i]) is not None:
                warped = warpers(input_ids[at : at + 1], scores[at : at + 1])
                token = _draw(torch, input_ids[at : at + 1], warped, self.nucleus[i], row.generator)
                scores[at] = -float("inf")
                scores[at, token] = 0.0
            elif raw is not None:
                token = scores[at].argmax()  # the pick `generate` makes of this row
            if raw is not None:
                self.logprobs[i].append(raw[token] - torch.logsumexp(raw, dim=-1))
                self.ranks[i].append((raw > raw[token]).sum())
        return scores

    def figures(self, i: int, tokens: int) -> SampledLogprobs:
        """Row i's figures over its reply's `tokens` tokens (through its end id or max_tokens; at least one)."""
        import torch

        k = self.rows[i].top_logprobs
        ranks = torch.stack(self.ranks[i][:tokens]).clamp(max=k - 1).tolist()
        return sampled.figures(torch.stack(self.logprobs[i][:tokens]).tolist(), ranks, k)


def _draw(torch: Any, input_ids: Any, warped: Any, nucleus: Any, generator: Any) -> Any:
    """One row's token, as transformers' top-p warper (`nucleus`, None: no top-p) and `torch.multinomial` over
    the whole vocabulary would give it, with the work spent on the tokens still standing only.
    - Top-p runs over the tokens top-k left: the others are -inf, sort first in its ascending sort and add
      nothing to its cumulative sums, so the cut is the same, for a sort of k values instead of the
      vocabulary's (3.6 ms of SmolLM2's 49k, 12 ms of Qwen3's 152k, per row and token).
    - torch 2.13's CPU multinomial of one sample is the argmax of p / q, q ~ Exp(1) one per vocabulary entry,
      each -log1p(-u) of a double u from the generator (aten/native/Distributions.cpp,
      core/TransformationHelper.h). Drawing every u (0.9 ms for 152k entries) but taking the logarithms of
      the kept tokens' only (all of them: 3.3 ms) leaves the generator where multinomial leaves it and picks
      the same token: a token cut has p = 0 and never wins.
    p is the softmax of the whole row, as multinomial's. The local engine's tests hold a step to transformers'
    warpers and multinomial, and every sampled reply to one seeded `generate`'s."""
    kept = torch.isfinite(warped[0]).nonzero().squeeze(1)
    if nucleus is not None:
        cut = nucleus(input_ids, warped[:, kept])
        warped = torch.full_like(warped, -float("inf"))
        warped[:, kept] = cut
        kept = kept[torch.isfinite(cut[0])]
    probs = torch.softmax(warped[0], dim=-1)
    u = torch.empty(warped.shape[-1], dtype=torch.float64).uniform_(generator=generator)
    return kept[torch.argmax(probs[kept] / (-torch.log1p(-u[kept])).float())]


class _RowLengths:
    """Stops each row at its own max_tokens (transformers pads an ended row from there), and the whole call once
    half its rows have ended or reached theirs: `ended` then tells `generate_rows` which to go on with."""

    def __init__(self, rows: list[Row], start: int, ends: list[int], each_step: Callable[[], None] | None) -> None:
        import torch

        self.limits, self.start, self.ends = torch.tensor([row.max_tokens for row in rows]), start, torch.tensor(ends)
        self.ended, self.each_step = torch.zeros(len(rows), dtype=torch.bool), each_step

    def __call__(self, input_ids: Any, scores: Any, **_: Any) -> Any:
        import torch

        if self.each_step is not None:
            self.each_step()

        at_limit = (input_ids.shape[1] - self.start) >= self.limits
        self.ended |= at_limit | torch.isin(input_ids[:, -1].cpu(), self.ends)
        if 2 * int(self.ended.sum()) >= len(self.ended):
            return torch.ones_like(at_limit, device=input_ids.device)
        return at_limit.to(input_ids.device)
