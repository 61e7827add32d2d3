"""Load a target: the profile's tokenizer, every structural token's id checked, the chat format compiled.

A drafter trained on ids that differ from what the target sees at serving time is silently worse (a real
run mapped Kimi's `<|im_end|>` to the wrong id), so loading refuses any mismatch instead of guessing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from eagle_data.targets.profile import AUTO, CHECKPOINT, Profile, TargetError, read_profiles
from eagle_data.targets.tokenizer import load_tokenizer, text_encoder, token_bytes

if TYPE_CHECKING:
    import polars as pl

    from eagle_data.targets.derived import DerivedTarget

Part = int | str  # a structural token id, or template text


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

    @property
    def think_ids(self) -> frozenset[int]:
        """The ids of the think block's structural tokens (none for a format without reasoning)."""
        return frozenset(p for p in (*self.template.think_open, *self.template.think_close) if isinstance(p, int))

    def prompt_ids(self, messages: list[dict[str, Any]], *, thinking: bool) -> list[int]:
        from eagle_data.targets.render import prompt_ids

        return prompt_ids(self, messages, thinking=thinking)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def training_rows(self, generations: pl.DataFrame, *, thinking: bool, mask_empty_think: bool = False
                      ) -> pl.DataFrame:  # fmt: skip
        from eagle_data.targets.rows import profile_rows

        return profile_rows(self, generations, thinking=thinking, mask_empty_think=mask_empty_think)


@cache
def load_target(name: str) -> Target | DerivedTarget:
    """The named profile from targets.toml (and the user's catalog), or with `checkpoint:<ref>` the target
    derived from that checkpoint; loaded and checked once per process."""
    if name.startswith(CHECKPOINT):
        from eagle_data.targets.derived import load_derived

        return load_derived(name.removeprefix(CHECKPOINT))
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
        text_encoder=text_encoder(tokenizer),
        template=template,
        token_text=token_text,
        token_bytes=token_bytes(tokenizer, token_text),
        control_pattern=pattern,
    )


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
