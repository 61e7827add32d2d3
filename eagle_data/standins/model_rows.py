"""A real instruct model's rows for the on-policy tests and benchmark (SmolLM2-135M-Instruct): its own replies
(greedy, sampled), the sample dataset's original answers and "OK." filler, as (input_ids, loss_mask) built with
the checkpoint's own chat template (prompt = apply_chat_template(messages, add_generation_prompt=True); reply =
the generated ids with the end token; mask 1 on the reply)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_data.catalog import SAMPLES_DIR
from eagle_data.engines.scoring import Row, TargetIds
from eagle_data.quality.on_policy import SamplingPoint

BATCH = 8


@dataclass(frozen=True)
class Smol:
    """The checkpoint's folder, tokenizer and model (fp32, loaded once per session)."""

    folder: Path
    tokenizer: Any
    model: Any

    @property
    def ids(self) -> TargetIds:
        return TargetIds(len(self.tokenizer), self.tokenizer.eos_token_id, None)


def load_smol() -> Smol:
    import torch

    from eagle_data.demo import ensure_smollm2
    from eagle_data.engines.local import _checkpoint, _fingerprint

    torch.set_num_threads(1)
    folder = ensure_smollm2().resolve()
    tokenizer, model = _checkpoint(folder, "cpu", _fingerprint(folder))
    return Smol(folder, tokenizer, model)


def sample_prompts(n: int, name: str = "b3_magicoder") -> list[tuple[str, str]]:
    """(instruction, original answer) of the first `n` rows of a bundled sample file."""
    lines = (SAMPLES_DIR / f"{name}.jsonl").read_text().splitlines()[:n]
    return [(row["instruction"], row["response"]) for row in map(json.loads, lines)]


def prompt_ids(smol: Smol, instruction: str, *, system: bool = True) -> list[int]:
    """The generation prompt under the checkpoint's template; without its default system turn when asked."""
    text = smol.tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], add_generation_prompt=True, tokenize=False
    )
    if not system:  # the template writes its default system turn first: drop that turn
        text = text.split("<|im_end|>\n", 1)[1]
    return list(smol.tokenizer(text, add_special_tokens=False)["input_ids"])


def generate(
    smol: Smol, prompts: Sequence[list[int]], temperature: float, top_p: float, max_new_tokens: int, seed: int = 0
) -> list[list[int]]:
    """Each prompt's reply ids (the end token included when it came), batched with left padding; sampled with
    no top-k cut (transformers would otherwise cut to 50 tokens)."""
    import torch

    torch.manual_seed(seed)
    eos, out = smol.tokenizer.eos_token_id, []
    for start in range(0, len(prompts), BATCH):
        batch = prompts[start : start + BATCH]
        width = max(map(len, batch))
        ids = torch.tensor([[eos] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            made = smol.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                pad_token_id=eos, **({"temperature": temperature, "top_p": top_p, "top_k": 0} if temperature else {}),
            )  # fmt: skip
        for reply in made[:, width:].tolist():
            out.append(reply[: reply.index(eos) + 1] if eos in reply else reply)
    return out


def rows(prompts: Sequence[list[int]], replies: Sequence[list[int]], point: SamplingPoint) -> list[Row]:
    """Rows as validation holds them: prompt + reply ids, the mask on the reply."""
    return [Row(p + r, [0] * len(p) + [1] * len(r), point) for p, r in zip(prompts, replies, strict=True)]


def text_reply(smol: Smol, text: str) -> list[int]:
    """A written reply's ids, with the end token."""
    return [*smol.tokenizer(text, add_special_tokens=False)["input_ids"], smol.tokenizer.eos_token_id]
