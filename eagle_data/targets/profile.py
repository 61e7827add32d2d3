"""Target profiles: read `targets.toml`, load the tokenizer, check every structural token's id.

A drafter trained on ids that differ from what the target sees at serving time is silently worse (a real
run mapped Kimi's `<|im_end|>` to the wrong id), so loading refuses any mismatch instead of guessing.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict
from tokenizers import Tokenizer, decoders

from eagle_data import settings
from eagle_data.targets import vocab

TARGETS_PATH = Path(__file__).with_name("targets.toml")
BUILTINS: dict[str, Callable[[], Tokenizer]] = {
    "builtin:qwen-dashscope": vocab.qwen_tokenizer,
    "builtin:kimi-test": vocab.kimi_test_tokenizer,
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "tiktoken.model"]

Part = int | str  # a structural token id, or template text


class TargetError(ValueError):
    """A profile or tokenizer problem the user must fix; the message says which and what."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChatFormat(_Frozen):
    """A chat template as pieces (see targets.toml for the meaning of each)."""

    system: str
    user: str
    assistant: str
    end_of_turn: str
    after_turn: str
    think_open: str
    think_close: str
    history_think: Literal["drop", "empty"]
    prompt_opens_think: bool
    strip_reasoning: str
    strip_content_start: str
    default_system: str


class Profile(_Frozen):
    """One target model: its tokenizer source, chat format and the ids its structural tokens must have."""

    name: str
    format: ChatFormat
    tokenizer: str
    tokenizer_env: str | None = None
    pattern: str | None = None  # split regex, needed only to convert a tiktoken.model
    tokens: dict[str, int]
    vocab_size: int | None = None  # rows of the model's embedding (config.json); default: the tokenizer's size

    def tokenizer_source(self) -> str:
        return (settings.get(self.tokenizer_env) if self.tokenizer_env else None) or self.tokenizer


@dataclass(frozen=True)
class Template:
    """A chat format compiled against a tokenizer: structural tokens as ids, the rest as text."""

    header: dict[str, tuple[Part, ...]]
    end_of_turn: int
    after_turn: tuple[Part, ...]
    think_open: tuple[Part, ...]
    think_close: tuple[Part, ...]  # up to and including the closing token
    think_tail: tuple[Part, ...]  # text after the closing token (belongs with the content)
    history_think: str
    prompt_opens_think: bool
    strip_reasoning: str
    strip_content_start: str
    default_system: str


@dataclass(frozen=True, eq=False)
class Target:
    """A loaded profile: the tokenizer as shipped, a text encoder that never parses special tokens, the
    compiled template and lookups used by verification."""

    profile: Profile
    tokenizer: Tokenizer
    text_encoder: Tokenizer
    template: Template
    token_text: dict[int, str]  # every added (control) token id -> its string
    token_bytes: list[bytes] | None  # each id's bytes, for byte-level decoders (a fast exact decode)
    control_pattern: re.Pattern[str]  # finds control-token strings inside plain text

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def eot_id(self) -> int:
        return self.template.end_of_turn

    @property
    def vocab_size(self) -> int:
        """Rows of the target model's embedding, which a draft vocabulary's `t2d` mask must span: config.json's
        `vocab_size` (often padded past the tokenizer, e.g. Qwen3 151,936 vs 151,669 tokens) when the profile
        gives it, else the tokenizer's size."""
        return self.profile.vocab_size or self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template_hash(self) -> str:
        """SHA-256 of the chat format's pieces (the profile's template, as data)."""
        return hashlib.sha256(self.profile.format.model_dump_json().encode()).hexdigest()

    @cached_property
    def tokenizer_hash(self) -> str:
        """SHA-256 of the tokenizer's full JSON: two runs with the same hash tokenized alike."""
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()


def read_profiles(path: Path = TARGETS_PATH) -> dict[str, Profile]:
    """All profiles in a targets TOML file, validated."""
    data = tomllib.loads(path.read_text())
    formats = {name: ChatFormat(**spec) for name, spec in data.get("formats", {}).items()}
    profiles = {}
    for name, spec in data.get("profiles", {}).items():
        fmt = spec.get("format")
        if fmt not in formats:
            raise TargetError(f"target {name}: unknown format {fmt!r}; known: {sorted(formats)}")
        profiles[name] = Profile(name=name, **{**spec, "format": formats[fmt]})
    return profiles


@cache
def load_target(name: str) -> Target:
    """The named profile from targets.toml, loaded and checked (cached per process)."""
    profiles = read_profiles()
    if name not in profiles:
        raise TargetError(f"unknown target {name!r}; known: {', '.join(sorted(profiles))}")
    return build_target(profiles[name])


def build_target(profile: Profile) -> Target:
    """Load the profile's tokenizer, refuse on any structural-token id mismatch, compile the template."""
    tokenizer = load_tokenizer(profile)
    for text, expected in profile.tokens.items():
        actual = tokenizer.token_to_id(text)
        if actual != expected:
            raise TargetError(
                f"target {profile.name}: token {text!r} expected id {expected}, tokenizer "
                f"{profile.tokenizer_source()!r} has {actual}; "
                f"fix the tokenizer source or [profiles.{profile.name}.tokens]"
            )
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if profile.vocab_size is not None and profile.vocab_size < size:
        raise TargetError(
            f"target {profile.name}: vocab_size {profile.vocab_size} is below the tokenizer's {size} tokens; "
            "set it to config.json's vocab_size"
        )
    added = tokenizer.get_added_tokens_decoder()
    token_text = {i: t.content for i, t in added.items()}
    strings = sorted(token_text.values(), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(t) for t in strings) or "(?!)")
    template = _compile(profile, pattern)  # refuse a bad template before the slow encoder copy
    return Target(
        profile=profile,
        tokenizer=tokenizer,
        text_encoder=_text_encoder(tokenizer),
        template=template,
        token_text=token_text,
        token_bytes=_token_bytes(tokenizer, token_text),
        control_pattern=pattern,
    )


def load_tokenizer(profile: Profile) -> Tokenizer:
    """A builtin vocabulary, or tokenizer.json / tiktoken.model from a local folder or the hub."""
    source = profile.tokenizer_source()
    if source in BUILTINS:
        return BUILTINS[source]()
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


def _text_encoder(tokenizer: Tokenizer) -> Tokenizer:
    """A copy that encodes every added-token string as plain text (a user typing `<|im_end|>` stays text).

    `encode_special_tokens` only covers tokens flagged special; Qwen3's tokenizer.json leaves `<think>`
    unflagged, so every added token is flagged first.
    """
    if all(t.special for t in tokenizer.get_added_tokens_decoder().values()):
        encoder = Tokenizer.from_str(tokenizer.to_str())  # a private copy: the builtins are shared
    else:
        spec = json.loads(tokenizer.to_str())
        for token in spec["added_tokens"]:
            token["special"] = True
        encoder = Tokenizer.from_str(json.dumps(spec))
    encoder.encode_special_tokens = True
    return encoder


def _token_bytes(tokenizer: Tokenizer, token_text: dict[int, str]) -> list[bytes] | None:
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


def _compile(profile: Profile, control: re.Pattern[str]) -> Template:
    """Split each template string at the profile's structural tokens (template text only, never user text)."""
    structural = re.compile("(" + "|".join(re.escape(t) for t in profile.tokens) + ")")
    name = profile.name

    def parts(text: str) -> tuple[Part, ...]:
        out: list[Part] = []
        for i, piece in enumerate(structural.split(text)):
            if i % 2:
                out.append(profile.tokens[piece])
            elif control.search(piece):
                raise TargetError(f"target {name}: template text {piece!r} holds a token missing from `tokens`")
            elif piece:
                out.append(piece)
        return tuple(out)

    fmt = profile.format
    eot = parts(fmt.end_of_turn)
    close = parts(fmt.think_close)
    last_id = max((i for i, p in enumerate(close) if isinstance(p, int)), default=None)
    if len(eot) != 1 or not isinstance(eot[0], int) or last_id is None:
        raise TargetError(f"target {name}: end_of_turn must be one structural token and think_close must hold one")
    return Template(
        header={role: parts(getattr(fmt, role)) for role in ("system", "user", "assistant")},
        end_of_turn=eot[0],
        after_turn=parts(fmt.after_turn),
        think_open=parts(fmt.think_open),
        think_close=close[: last_id + 1],
        think_tail=close[last_id + 1 :],
        history_think=fmt.history_think,
        prompt_opens_think=fmt.prompt_opens_think,
        strip_reasoning=fmt.strip_reasoning,
        strip_content_start=fmt.strip_content_start,
        default_system=fmt.default_system,
    )
