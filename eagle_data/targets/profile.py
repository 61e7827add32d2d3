"""Target profiles as data: read `targets.toml` (chat formats, tokenizer sources, structural token ids), with the
`[targets]` table of a user's catalog merged over it, and pick the target a dataset's `target = "auto"` means:
the model's own checkpoint where its tokenizer is at hand offline, else a verified preset. `target.py` loads one."""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from eagle_data import settings
from eagle_data.catalog import CATALOG_PATH, USER_CATALOG_ENV, read_table
from eagle_data.types import UserError

TARGETS_PATH = Path(__file__).with_name("targets.toml")
AUTO = "auto"  # a dataset's `target` that means: the served model's own checkpoint, else its verified preset
CHECKPOINT = "checkpoint:"  # a `target` naming a checkpoint folder, GGUF file or hub id: "checkpoint:/models/my-8b"
TOKENIZER_ENV = "EAGLE_DATA_TARGET_TOKENIZER"  # the served model's tokenizer and chat template (a folder or hub id)


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
    format_name: str = ""  # the [formats.*] table it names
    tokenizer: str
    tokenizer_env: str | None = None
    pattern: str | None = None  # split regex, needed only to convert a tiktoken.model
    tokens: dict[str, int]
    vocab_size: int | None = None  # rows of the model's embedding (config.json); default: the tokenizer's size
    date: str | None = None  # the `{date}` of the format's system preamble (a template's date_string)

    def tokenizer_source(self) -> str:
        return (settings.get(self.tokenizer_env) if self.tokenizer_env else None) or self.tokenizer


def _tables(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, tables) of `path`, then, for the packaged file, the `[targets]` table of the user's catalog."""
    tables = [(str(path), tomllib.loads(path.read_text()))]
    if path == TARGETS_PATH and (user := read_table_user()):
        tables.append((f"[targets] of ${USER_CATALOG_ENV}", user))
    return tables


def read_table_user() -> dict[str, Any]:
    """The user's catalog's `[targets]` table ({} without one): profiles, formats and served models it adds or
    overrides, so a team's own model needs no edit of the installed package."""
    return read_table(CATALOG_PATH, "targets") if settings.get(USER_CATALOG_ENV) else {}


def read_profiles(path: Path = TARGETS_PATH) -> dict[str, Profile]:
    """All profiles, validated: the file's, and for the packaged file those a user's catalog adds or overrides."""
    formats: dict[str, ChatFormat] = {}
    specs: dict[str, tuple[str, dict[str, Any]]] = {}
    for where, data in _tables(path):
        for name, spec in data.get("formats", {}).items():
            formats[name] = _validated(ChatFormat, spec, f"format {name} ({where})")
        specs.update({name: (where, spec) for name, spec in data.get("profiles", {}).items()})
    profiles = {}
    for name, (where, spec) in specs.items():
        fmt = spec.get("format")
        if fmt not in formats:
            raise TargetError(f"target {name} ({where}): unknown format {fmt!r}; known: {sorted(formats)}")
        fields = {**spec, "name": name, "format": formats[fmt], "format_name": fmt}
        profiles[name] = _validated(Profile, fields, f"target {name} ({where})")
    return profiles


def _validated(model: type[_Frozen], spec: dict[str, Any], what: str) -> Any:
    try:
        return model(**spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TargetError(f"{what}: {where} = {first.get('input')!r}: {first['msg']}") from None


def served_models(path: Path = TARGETS_PATH) -> dict[str, str]:
    """[served_models]: model-id glob -> profile name, the user's catalog's first, then the file's, in order."""
    merged: dict[str, str] = {}
    for _, data in reversed(_tables(path)):
        merged.update({glob: name for glob, name in data.get("served_models", {}).items() if glob not in merged})
    return merged


def target_for_model(model: str) -> str | None:
    """The profile verified for a served model id, or None when no pattern matches."""
    lowered = model.lower()
    return next((name for glob, name in served_models().items() if fnmatch.fnmatchcase(lowered, glob)), None)


def resolve_target(target: str, models: Iterable[str]) -> str:
    """The dataset's `target`, or with "auto" the one target its served models have: the model's own checkpoint
    where its tokenizer and template are at hand offline (EAGLE_DATA_TARGET_TOKENIZER, a local folder or GGUF
    file as the model, a hub id in the local cache), else the profile verified for its id ([served_models]).
    Refuses models with neither, and models that map to different targets."""
    if target != AUTO:
        return target
    ids = sorted({m for m in models if m})
    if not ids:
        raise TargetError(
            'target "auto" needs the served model id, and the rows name none; set `target` in the catalog'
        )
    if given := settings.get(TOKENIZER_ENV):
        return CHECKPOINT + given
    picked = {m: _own_checkpoint(m) or target_for_model(m) for m in ids}
    unknown = [m for m, name in picked.items() if name is None]
    if unknown:
        raise TargetError(
            f"target \"auto\": the tokenizer of model {unknown[0]!r} is not available offline; set {TOKENIZER_ENV} "
            f"to a local folder holding its tokenizer and chat template, or set `target` for this dataset to one "
            f"of {', '.join(sorted(read_profiles()))}"
        )
    names = sorted({name for name in picked.values() if name})
    if len(names) > 1:
        raise TargetError(f"models {ids} map to different targets {names}; set `target` in the catalog")
    return names[0]


def _own_checkpoint(model: str) -> str | None:
    """`checkpoint:<model>` when the model id is itself a checkpoint at hand: a local folder with a tokenizer, a
    GGUF file, or a hub id whose tokenizer is in the local Hugging Face cache."""
    path = Path(model).expanduser()
    if (path.is_dir() and (path / "tokenizer_config.json").is_file()) or (path.suffix == ".gguf" and path.is_file()):
        return CHECKPOINT + str(path.resolve())
    if model.count("/") == 1 and not path.exists():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "tokenizer_config.json")
        except Exception:  # an id the hub's validators refuse is no cached checkpoint
            return None
        if isinstance(cached, str):
            return CHECKPOINT + model
    return None
