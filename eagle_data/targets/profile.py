"""Target profiles as data: read `targets.toml` (chat formats, tokenizer sources, structural token ids) and pick
the profile a served model maps to. `target.py` loads one and checks it."""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from eagle_data import settings
from eagle_data.types import UserError

TARGETS_PATH = Path(__file__).with_name("targets.toml")
AUTO = "auto"  # a dataset's `target` that means: pick the profile from the served model id


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
