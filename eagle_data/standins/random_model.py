"""A tiny random-weight Qwen3 model with the real Qwen3 vocabulary: the stand-in for a model where a test needs
speed and the text does not matter (its text is word salad; the demo runs a real instruct model, eagle_data.demo).

Two weight tweaks keep its data well-formed: the output layer only ever prefers plain-ASCII tokens (so replies
decode cleanly), and a constant residual feature drives the end-of-turn logit, so replies end on their own after
35-600 tokens at the demo's sampling (on the demo sample: median 160, none under the short-reply gate). It carries
its own chat template (Qwen3's thinking blocks), so `target = "auto"` derives its ids from it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from eagle_data import settings

RANDOM_VERSION = "3"  # 2: added tokens such as <|vision_end|> are never preferred; 3: longer replies

# ChatML with Qwen3's thinking blocks, written for this project (Qwen3's own template behaves the same way
# for plain chat): reasoning is shown only on assistant turns after the last user message; with thinking
# off the generation prompt carries an empty think block.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_user -%}"
    "{{- '<think>\\n' + (m.reasoning_content or m.reasoning or '').strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- m.content.lstrip('\\n') + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def random_model_path() -> Path:
    return settings.cache_folder() / f"random-qwen3-v{RANDOM_VERSION}"


def ensure_random_model(path: Path | None = None) -> Path:
    """Build the random checkpoint once (about 10 s, 60 MB); later calls reuse it. Built beside `path` and
    renamed into place, so two processes building it at once (parallel tests) never read half a checkpoint."""
    path = path or random_model_path()
    if not (path / "model.safetensors").is_file():
        staging = path.with_name(f"{path.name}.building-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        build_random_model(staging)
        try:
            os.replace(staging, path)
        except OSError:  # another process put it in place first (or left an unfinished folder there)
            if not (path / "model.safetensors").is_file():
                shutil.rmtree(path, ignore_errors=True)
                os.replace(staging, path)
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _ascii_token_ids(tokenizer) -> list[int]:
    """Ids of ordinary tokens made of printable ASCII (letters, digits, punctuation, spaces). Added tokens
    (`<|vision_end|>`, `<think>` ...) are left out: a reply holding one is rightly judged broken."""
    keep, added = [], set(tokenizer.get_added_vocab().values())
    for idx in tokenizer.get_vocab().values():
        text = tokenizer.decode([idx])
        if text and text.isascii() and text.isprintable() and idx not in added:
            keep.append(idx)
    return sorted(keep)


def build_random_model(path: Path, *, seed: int = 0, eos_bias: float = 0.7, ascii_scale: float = 40.0) -> Path:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from eagle_data.targets.vocab import qwen_tokenizer

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=qwen_tokenizer(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        attention_bias=True,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config).eval()
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        # Feature 0 of the residual stream is held large by the last layer's output bias, so after the
        # final norm it is nearly constant: the end-of-turn logit reads it, every other row ignores it.
        model.model.layers[-1].self_attn.o_proj.bias.zero_()
        model.model.layers[-1].self_attn.o_proj.bias[0] = 30.0
        head = model.lm_head.weight
        allowed = torch.tensor(_ascii_token_ids(tokenizer))
        mask = torch.zeros(head.shape[0], dtype=torch.bool)
        mask[allowed] = True
        head[~mask] = 0.0
        head[mask] = torch.randn(int(mask.sum()), head.shape[1]) * ascii_scale
        head[:, 0] = 0.0
        # Non-ASCII tokens read feature 0 negatively (far below the ASCII rows); end-of-turn gets a fixed logit.
        head[~mask, 0] = -4.0
        head[eos] = 0.0
        head[eos, 0] = eos_bias
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "RANDOM_MODEL.json").write_text(
        json.dumps({"note": "random weights: generated text is meaningless", "version": RANDOM_VERSION}, indent=1)
    )
    return path
