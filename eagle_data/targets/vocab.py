"""Real vocabularies available offline.

The PyPI package `dashscope` ships Qwen's BPE ranks; converted with Qwen's pre-tokenizer pattern and
its 26 special tokens, the result matches Qwen2/Qwen3 tokenizers id for id (vocab 151,669).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]


def qwen_ranks_file() -> Path:
    import dashscope

    return Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"


@cache
def qwen_tokenizer() -> Tokenizer:
    """Qwen2/Qwen3's tokenizer built from dashscope's ranks (~2 s; cached per process)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    return TikTokenConverter(
        vocab_file=str(qwen_ranks_file()), pattern=QWEN_PATTERN, extra_special_tokens=QWEN_SPECIALS
    ).converted()


KIMI_BASE_VOCAB = 163_584  # Kimi's BPE ranks end here; 256 reserved special slots follow
KIMI_RESERVED = 256
KIMI_SPECIALS = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    "<|im_end|>": 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "[EOT]": 163593,
    "<|im_system|>": 163594,
    "<|im_middle|>": 163601,
    "<think>": 163606,
    "</think>": 163607,
    "[UNK]": 163838,
    "[PAD]": 163839,
}


def kimi_reserved_names() -> list[str]:
    """Kimi's 256 special slots in id order; unnamed ones follow Kimi's `<|reserved_token_{id}|>` rule."""
    by_id = {i: s for s, i in KIMI_SPECIALS.items()}
    return [by_id.get(i, f"<|reserved_token_{i}|>") for i in range(KIMI_BASE_VOCAB, KIMI_BASE_VOCAB + KIMI_RESERVED)]


@cache
def kimi_test_tokenizer() -> Tokenizer:
    """A Kimi-layout tokenizer for offline tests: Qwen's BPE ranks, Kimi's special tokens at Kimi's ids.

    Ids 151,643..163,583 (real Kimi BPE tokens) are filled with vocabulary entries no merge can reach,
    so every special id, and the vocab size 163,840, line up with Kimi K2/K2.5.
    """
    from transformers.convert_slow_tokenizer import TikTokenConverter

    base = TikTokenConverter(vocab_file=str(qwen_ranks_file()), pattern=QWEN_PATTERN).converted()
    spec = json.loads(base.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<|kimi_unreachable_{i}|>": i for i in range(len(vocab), KIMI_BASE_VOCAB)})
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens(kimi_reserved_names())
    return tok
