"""Real vocabularies available offline.

The PyPI package `dashscope` ships Qwen's BPE ranks; converted with Qwen's pre-tokenizer pattern and
its 26 special tokens, the result matches Qwen2/Qwen3 tokenizers id for id (vocab 151,669).
`llama-models` ships Meta's Llama 3 ranks (`llama_models/llama3/tokenizer.model`, 128,000 + 256 specials);
`mistral-common` ships Mistral's Tekken vocabulary (`mistral_common/data/tekken_240718.json`, 1,000 control
slots then 130,072 BPE tokens). Both convert to fast tokenizers that the conformance tests hold id for id
against those packages' own encoders. Each is built once per machine and then loaded from the cache folder
(`vocab_cache`), checked against the layout defined here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from tokenizers import Tokenizer

from eagle_data.targets.vocab_cache import Layout, cached_tokenizer

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_BASE_VOCAB = 151_643  # dashscope's BPE ranks end here; the specials follow in this order
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


def package_file(package: str, *parts: str) -> Path:
    """A data file shipped inside an installed package, found without importing it (dashscope takes 0.5 s)."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the package {package!r} is not installed; pip install it")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def qwen_ranks_file() -> Path:
    return package_file("dashscope", "resources", "qwen.tiktoken")


def recipe() -> bytes:
    """This module's source: the code that builds every builtin, so editing a recipe rebuilds its cached copy."""
    return Path(__file__).read_bytes()


def numbered(names: Sequence[str], first: int) -> dict[str, int]:
    """Special tokens with consecutive ids from `first`."""
    return {name: first + i for i, name in enumerate(names)}


def convert_tiktoken(ranks: Path, pattern: str, specials: Sequence[str] = ()) -> Tokenizer:
    """A fast tokenizer converted from tiktoken BPE ranks, with `specials` after the last rank (5-8 CPU-s)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    return TikTokenConverter(vocab_file=str(ranks), pattern=pattern, extra_special_tokens=list(specials)).converted()


@cache
def qwen_tokenizer() -> Tokenizer:
    """Qwen2/Qwen3's tokenizer built from dashscope's ranks (cached per process and on disk)."""
    ranks = qwen_ranks_file()
    return cached_tokenizer(
        "qwen",
        recipe=recipe(),
        inputs=[ranks.read_bytes(), QWEN_PATTERN],
        layout=Layout(QWEN_BASE_VOCAB + len(QWEN_SPECIALS), numbered(QWEN_SPECIALS, QWEN_BASE_VOCAB)),
        build=lambda: convert_tiktoken(ranks, QWEN_PATTERN, QWEN_SPECIALS),
    )


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
    so every special id, and the vocab size 163,840, line up with Kimi K2/K2.5 (cached per process and on disk).
    """
    ranks = qwen_ranks_file()

    def build() -> Tokenizer:
        spec = json.loads(convert_tiktoken(ranks, QWEN_PATTERN).to_str())
        vocab = spec["model"]["vocab"]
        vocab.update({f"<|kimi_unreachable_{i}|>": i for i in range(len(vocab), KIMI_BASE_VOCAB)})
        tok = Tokenizer.from_str(json.dumps(spec))
        tok.add_special_tokens(kimi_reserved_names())
        return tok

    return cached_tokenizer(
        "kimi-test",
        recipe=recipe(),
        inputs=[ranks.read_bytes(), QWEN_PATTERN],
        layout=Layout(KIMI_BASE_VOCAB + KIMI_RESERVED, numbered(kimi_reserved_names(), KIMI_BASE_VOCAB)),
        build=build,
    )


LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
LLAMA3_SPECIALS = [  # ids 128000.. in this order, then reserved slots up to 256 (Meta's llama3/tokenizer.py)
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
LLAMA3_BASE_VOCAB = 128_000
LLAMA3_RESERVED = 256


@cache
def llama3_tokenizer() -> Tokenizer:
    """Llama 3.x's tokenizer from the ranks in `llama-models` (vocab 128,256; cached per process and on disk)."""
    reserved = [f"<|reserved_special_token_{2 + i}|>" for i in range(LLAMA3_RESERVED - len(LLAMA3_SPECIALS))]
    specials = LLAMA3_SPECIALS + reserved
    ranks = package_file("llama_models", "llama3", "tokenizer.model")
    return cached_tokenizer(
        "llama3",
        recipe=recipe(),
        inputs=[ranks.read_bytes(), LLAMA3_PATTERN],
        layout=Layout(LLAMA3_BASE_VOCAB + LLAMA3_RESERVED, numbered(specials, LLAMA3_BASE_VOCAB)),
        build=lambda: convert_tiktoken(ranks, LLAMA3_PATTERN, specials),
    )


def tekken_file() -> Path:
    return package_file("mistral_common", "data", "tekken_240718.json")


TEKKEN_CONTROLS = 1_000
TEKKEN_VOCAB = 131_072


@cache
def mistral_tekken_tokenizer() -> Tokenizer:
    """Mistral's Tekken tokenizer (v3, Mistral NeMo) from `mistral-common`: BPE token `rank` has id
    1,000 + rank; ids 0..999 are control slots named as mistral-common names them (vocab 131,072; cached per
    process and on disk)."""
    source = tekken_file().read_bytes()
    return cached_tokenizer(
        "mistral-tekken",
        recipe=recipe(),
        inputs=[source],
        layout=Layout(TEKKEN_VOCAB, numbered(tekken_control_names(TEKKEN_CONTROLS), 0)),
        build=lambda: convert_tekken(source),
    )


def convert_tekken(source: bytes) -> Tokenizer:
    """The conversion behind `mistral_tekken_tokenizer` (its count of control slots read from the file)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    spec = json.loads(source)
    config = spec["config"]
    controls = config["default_num_special_tokens"]
    kept = config["default_vocab_size"] - controls
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in spec["vocab"][:kept]}

    class _Ranks(TikTokenConverter):
        def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:  # type: ignore[override]
            return ranks

    base = _Ranks(vocab_file="", pattern=config["pattern"]).converted()
    tok = json.loads(base.to_str())
    vocab = {text: i + controls for text, i in tok["model"]["vocab"].items()}
    names = tekken_control_names(controls)
    if clash := set(names) & set(vocab):
        raise ValueError(f"Tekken control names {sorted(clash)} are also BPE tokens")
    tok["model"]["vocab"] = {**dict(zip(names, range(controls), strict=True)), **vocab}
    tokenizer = Tokenizer.from_str(json.dumps(tok))
    tokenizer.add_special_tokens(names)
    return tokenizer


def tekken_control_names(count: int) -> list[str]:
    """The control slots in id order: mistral-common's named ones, then `<SPECIAL_{id}>` fillers."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    named = [getattr(t["token_str"], "value", t["token_str"]) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    return named + [Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i) for i in range(len(named), count)]
