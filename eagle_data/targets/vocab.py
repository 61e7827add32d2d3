"""Real vocabularies available offline.

The PyPI package `dashscope` ships Qwen's BPE ranks; converted with Qwen's pre-tokenizer pattern and
its 26 special tokens, the result matches Qwen2/Qwen3 tokenizers id for id (vocab 151,669).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from tokenizers import Tokenizer

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_SPECIALS = (
    "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> <|box_end|> "
    "<|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|> "
    "<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> "
    "<|file_sep|> <tool_response> </tool_response> <think> </think>"
).split()


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
