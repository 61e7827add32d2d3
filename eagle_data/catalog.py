"""The catalog: one loader and one validated model of `catalog.toml` and the user's file over it.

Adding a dataset is one `[datasets.<name>]` table in the TOML file; no code changes. A profile
(`EAGLE_DATA_PROFILE=demo`) overlays settings on every entry, e.g. bundled samples and small shards. The other
tables (`[exports]`, `[drafter]`, `[automation]`) are validated by the model of the room that reads them
(`Catalog.section`); the code location validates every one when it loads, so a bad value is one line naming
its key and the file it came from, before anything runs.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eagle_data import settings
from eagle_data.types import UserError

CATALOG_PATH = Path(__file__).with_name("catalog.toml")
SAMPLES_DIR = Path(__file__).parent / "data" / "samples"
SAMPLE = "sample"  # `source` of an entry read from its bundled sample file, SAMPLES_DIR/{name}.jsonl
PROFILE_ENV = "EAGLE_DATA_PROFILE"
USER_CATALOG_ENV = "EAGLE_DATA_CATALOG"  # a user's TOML file merged over the packaged catalog
# Ceilings no real dataset reaches: a value past one is a typo (1e308 for a weight, 100000 for 10 turns) that
# would otherwise overflow the mix or plan an endless conversation.
MAX_WEIGHT = 1e6  # mix_weight, a mixture setting's weight (relative: only their ratios count)
MAX_TURNS = 1000  # replies regenerated per conversation
MAX_REPLY_TOKENS = 1_000_000  # max_tokens / min_tokens of one reply
MAX_SHARD_SIZE = 1_000_000
MAX_PROMPTS = 1_000_000_000
NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_]{0,63}"  # a dataset name: a Dagster asset and group name, a storage folder


class CatalogError(UserError, ValueError):
    """A catalog or dataset-name problem the user must fix; the message says what and how."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Adapter(_Frozen):
    """Where a source row keeps its conversation: either `messages_field` (a list of turns with
    `role_key`/`content_key`) or a single-turn pair `prompt_field`/`response_field`; optionally
    `system_field` (a column holding a system prompt) and `id_field` (the source's own row id)."""

    messages_field: str | None = None
    role_key: str = "role"
    content_key: str = "content"
    prompt_field: str | None = None
    response_field: str | None = None
    system_field: str | None = None
    id_field: str | None = None

    @model_validator(mode="after")
    def _one_layout(self) -> Adapter:
        if (self.messages_field is None) == (self.prompt_field is None):
            raise ValueError("set exactly one of messages_field or prompt_field")
        return self


class SamplingSetting(_Frozen):
    """One setting of a sampling mixture; a field left unset keeps the entry's own generation setting."""

    name: str = Field(min_length=1)
    weight: float = Field(gt=0, le=MAX_WEIGHT)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    thinking: bool | None = None


class Generation(_Frozen):
    """Sampling settings; part of the resume key (config hash).

    `mixture`: several sampling settings with weights; each prompt gets one, by a hash of its id and
    `mixture_seed` (eagle_data/runner/mixture.py), so a re-run assigns the same and the resume key
    (prompt id + this config's hash) fixes the setting a stored reply was made with.
    """

    max_tokens: int = Field(4096, gt=0, le=MAX_REPLY_TOKENS)
    min_tokens: int = Field(0, ge=0, le=MAX_REPLY_TOKENS)  # honoured by engines that support it (local, SGLang)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    thinking: bool = True
    mixture: tuple[SamplingSetting, ...] = ()
    mixture_seed: int = 0

    @field_validator("mixture")
    @classmethod
    def _distinct_names(cls, mixture: tuple[SamplingSetting, ...]) -> tuple[SamplingSetting, ...]:
        names = [s.name for s in mixture]
        if len(set(names)) != len(names):
            raise ValueError(f"mixture setting names must be distinct: {names}")
        return mixture


class Checks(_Frozen):
    """Quality thresholds (eagle_data/quality/gates.py says what each gates). Shares are fractions, 0 to 1,
    checked at load: a percent typed for one (2 for 2 %) would let every shard pass."""

    min_loss_tokens: int = Field(16, ge=0)
    max_short_share: float = Field(0.01, ge=0, le=1)
    max_same_loss_share: float = Field(0.20, ge=0, le=1)
    max_repeat_share: float = Field(0.05, ge=0, le=1)
    max_truncated_share: float = Field(0.05, ge=0, le=1)
    max_failed_share: float = Field(0.02, ge=0, le=1)
    max_length_shift: float = Field(0.50, ge=0)  # a relative change: 0.5 is half as long or half as long again
    max_missing_reasoning_share: float = Field(0.01, ge=0, le=1)
    lost_text_tolerance: float = Field(0.10, ge=0, le=1)  # a row whose text holds less of the reported tokens
    max_lost_text_share: float = Field(0.01, ge=0, le=1)
    prompt_tokens_tolerance: float = Field(0.02, ge=0, le=1)  # the server's prompt count vs our rendering's
    max_loop_share: float = Field(0.05, ge=0, le=1)  # replies set aside as `loop` (eagle_data/quality/verdicts.py)
    # A share gate fails when the one-sided lower bound of its share at this confidence is over its threshold.
    confidence: float = Field(0.999, gt=0.5, lt=1)


class Breaker(_Frozen):
    """The breaker that judges replies as they arrive (eagle_data/runner/breaker.py, docs/breaker.md): over the
    last `window` answered replies (once `min_replies` are in), a verdict's share trips it when its lower bound
    at `confidence` exceeds its gate; a billed reply with no usable text is asked again `empty_retries` times."""

    enabled: bool = True
    window: int = Field(200, gt=0)
    min_replies: int = Field(50, gt=0)
    confidence: float = Field(0.9999999, gt=0.5, lt=1)
    empty_retries: int = Field(1, ge=0)

    @model_validator(mode="after")
    def _min_within_window(self) -> Breaker:
        if self.min_replies > self.window:
            raise ValueError(f"min_replies {self.min_replies} exceeds window {self.window}")
        return self


class OnPolicy(_Frozen):
    """The on-policy score of validated shards and its blocking check (eagle_data/quality/on_policy.py; each key
    in docs/design.md): `scorer` "auto" (the embedded engine's own checkpoint, for its rows), "none", "transformers"
    (`checkpoint`), "sglang" or "vllm" (a server at `url`, serving `model`)."""

    scorer: Literal["auto", "none", "transformers", "sglang", "vllm"] = "auto"
    checkpoint: str = ""
    url: str = ""
    model: str = ""
    sample_rows: int = Field(32, ge=0)
    top_logprobs: int = Field(20, gt=0, le=1000)
    sampled_logprobs: bool = False  # generation asks for its tokens' log-probabilities and ranks (quality/sampled.py)
    agreement_tolerance: float = Field(0.05, ge=0, le=1)
    logprob_tolerance: float = Field(0.5, ge=0)
    confidence: float = Field(0.999, gt=0.5, lt=1)


class DatasetSpec(_Frozen):
    """One catalog entry with defaults and the active profile applied."""

    name: str
    title: str = ""
    hub_id: str | None = None
    config: str | None = None
    split: str = "train"
    source: str | None = None  # None: the hub; SAMPLE: the bundled sample; else a local file path
    adapter: Adapter
    shard_size: int = Field(500, gt=0, le=MAX_SHARD_SIZE)
    max_prompts: int = Field(100_000, gt=0, le=MAX_PROMPTS)
    max_prompt_chars: int = Field(32_000, gt=0)
    max_skipped_share: float = Field(0.5, ge=0, le=1)  # more source rows skipped fails the prompts step
    regenerate: Literal["all", "first"] = "all"
    max_turns: int = Field(8, gt=0, le=MAX_TURNS)
    token_budget: int = Field(0, ge=0)
    cost_budget_usd: float = Field(0.0, ge=0)
    target: str = "auto"
    mix_weight: float = Field(1.0, ge=0, le=MAX_WEIGHT)  # share of this dataset in the training mix (exports)
    mask_empty_think: bool = False  # loss mask 0 on an empty think block the model wrote (nothing to learn)
    # Before generation, an engine that reports the prompt ids its server rendered sends one prompt, and a server
    # that renders it otherwise than `target` stops the run; false forces past (its rows are prompt_mismatch).
    check_server_template: bool = True
    # Prompts the estimate draws across the dataset and judges by the quality gates before generation.
    canary_prompts: int = Field(64, gt=0, le=MAX_PROMPTS)
    generation: Generation = Generation()
    checks: Checks = Checks()
    breaker: Breaker = Breaker()
    on_policy: OnPolicy = OnPolicy()
    # Shown as the assets' owners in the Dagster catalog: an email or "team:<name>" (Dagster's two forms).
    owners: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name_form(cls, name: str) -> str:
        if not re.fullmatch(NAME_PATTERN, name):
            raise ValueError("a dataset name must start with a letter and hold only letters, digits and "
                             "underscores (up to 64): it names the Dagster assets and the storage folder")  # fmt: skip
        return name

    @field_validator("owners")
    @classmethod
    def _owner_forms(cls, owners: tuple[str, ...]) -> tuple[str, ...]:
        if bad := [o for o in owners if not re.fullmatch(r"team:\S+|[^@\s]+@[^@\s]+", o)]:
            raise ValueError(f"owners {bad} must each be an email or 'team:<name>'")
        return owners

    @property
    def num_shards(self) -> int:
        return math.ceil(self.max_prompts / self.shard_size)

    @property
    def partition_keys(self) -> list[str]:
        return [shard_key(i) for i in range(self.num_shards)]

    @property
    def sample_path(self) -> Path:
        return SAMPLES_DIR / f"{self.name}.jsonl"


def shard_key(index: int) -> str:
    """Partition key of shard `index`: zero-padded so keys sort in shard order."""
    return f"{index:05d}"


def shard_index(key: str) -> int:
    return int(key)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _parse(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"catalog file {path} is not valid TOML: {exc}") from None


class CatalogFiles:
    """The catalog's files, each read once: the packaged catalog.toml and over it, table by table, the user's
    ($EAGLE_DATA_CATALOG), so a team keeps its datasets and settings without editing the installed package;
    `origin` names the file a value came from, so every error names the file to fix."""

    def __init__(self, path: Path = CATALOG_PATH) -> None:
        self.path = path
        self.user_path = _user_path() if path == CATALOG_PATH else None
        self.user: dict[str, Any] = _parse(self.user_path) if self.user_path else {}  # the user's tables alone
        self.tables = _merge(_parse(path), self.user)

    def table(self, name: str) -> dict[str, Any]:
        """A top-level table as merged; {} when absent."""
        table = self.tables.get(name, {})
        if not isinstance(table, dict):
            raise CatalogError(f"[{name}] in {self.origin((name,))} must be a table: write [{name}] and keys under it")
        return table

    def origin(self, *paths: tuple[Any, ...]) -> Path:
        """The file that set the value at one of `paths` (tables, then keys and list indexes): the user's when it
        sets that value, or a list or table holding it, at any of them; else the packaged file."""
        return self.user_path if self.user_path and any(_holds(self.user, p) for p in paths) else self.path


def _user_path() -> Path | None:
    user = settings.get(USER_CATALOG_ENV)
    if not user:
        return None
    path = Path(user).expanduser()
    if not path.is_file():
        raise CatalogError(f"{USER_CATALOG_ENV}={user}: no such file; point it at your catalog TOML or unset it")
    return path


def _holds(tables: dict[str, Any], path: tuple[Any, ...]) -> bool:
    """Whether `tables` sets the value at `path` (or a list or string where the rest of the path points inside)."""
    node: Any = tables
    for part in path:
        if not isinstance(node, dict):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def _one_line(exc: ValidationError, where: str, origin: Callable[[tuple[Any, ...]], Path]) -> CatalogError:
    """A validation error as one line: `where`, the first bad key, its value, what is wrong and the file to fix
    (`origin` of the key's path); a message naming its own setting ("[drafter.capture] layers = ...") stands."""
    first = exc.errors()[0]
    loc, message = tuple(first["loc"]), first["msg"].removeprefix("Value error, ")
    if not message.startswith("["):
        message = f"{where}{'.'.join(map(str, loc))} = {first.get('input')!r}: {message}"
    return CatalogError(f"{message} (fix {origin(loc)})")


S = TypeVar("S", bound="Section")


class Section(_Frozen):
    """A top-level table of the catalog other than the datasets, validated by the model of the room that reads
    it; `TABLE` is its name ("exports")."""

    TABLE: ClassVar[str]


@dataclass(frozen=True)
class Catalog:
    """The catalog as one validated model: every dataset entry (with the profile applied), every other table
    (`section`: validated by its room's model on first read, then kept), and the files it came from (`files`:
    the raw merged tables, the user's own and `origin`, for a room that validates a table of its own: the target
    profiles a user's catalog may add)."""

    datasets: dict[str, DatasetSpec]
    files: CatalogFiles
    profile: str
    _sections: dict[type, Section] = field(default_factory=dict, compare=False)

    def section(self, model: type[S]) -> S:
        """The table `model.TABLE`, validated; a bad value is one line naming the key and its file."""
        if model not in self._sections:
            try:
                self._sections[model] = model(**self.files.table(model.TABLE))
            except ValidationError as exc:
                raise _one_line(exc, f"[{model.TABLE}] ", lambda loc: self.files.origin((model.TABLE, *loc))) from None
        return self._sections[model]  # type: ignore[return-value]


def load(path: Path = CATALOG_PATH, profile: str | None = None) -> Catalog:
    """Read and validate the catalog; `profile` defaults to $EAGLE_DATA_PROFILE. A profile overlays every entry,
    but never a key the user's catalog ($EAGLE_DATA_CATALOG) sets, in its entry or its [defaults]. A profile that
    reads the bundled samples (`source = "sample"`, the demo) leaves out an entry with no sample file: a dataset
    added in a user's catalog needs none, and runs on the demo profile once its entry sets its own `source`."""
    files = CatalogFiles(path)
    profile = settings.get(PROFILE_ENV) if profile is None else profile
    profiles = files.table("profiles")
    if profile and profile not in profiles:
        raise CatalogError(f"unknown profile {profile!r} in {PROFILE_ENV}; known: {', '.join(sorted(profiles))}")
    overlay = profiles.get(profile, {}) if profile else {}
    user, defaults = files.user, files.table("defaults")
    specs = {}
    for name, entry in files.table("datasets").items():
        merged = _merge(_merge(defaults, entry), overlay)
        if overlay:  # the user's own keys win over the profile's
            merged = _merge(merged, _merge(user.get("defaults", {}), user.get("datasets", {}).get(name, {})))
        if merged.get("source") == SAMPLE and not (SAMPLES_DIR / f"{name}.jsonl").is_file():
            continue  # a profile of bundled samples (the demo) leaves out a dataset that ships none
        try:
            specs[name] = DatasetSpec(name=name, **merged)
        except ValidationError as exc:
            tables = [("datasets", name), ("defaults",), ("profiles", profile)]

            def origin(loc: tuple[Any, ...], tables: list[tuple[Any, ...]] = tables) -> Path:
                return files.origin(*((*t, *loc) for t in tables)) if loc != ("name",) else files.origin(tables[0])

            raise _one_line(exc, f"catalog entry {name!r}: ", origin) from None
    return Catalog(specs, files, profile)


def load_catalog(path: Path = CATALOG_PATH, profile: str | None = None) -> dict[str, DatasetSpec]:
    """The dataset entries of `load(path, profile)`."""
    return load(path, profile).datasets


@cache
def _loaded(user: str, profile: str) -> Catalog:
    """`load` once per configuration: the user's file and the profile are the cache key."""
    return load(profile=profile)


def current() -> Catalog:
    """The catalog as the environment configures it, read and validated once per process and configuration."""
    return _loaded(settings.get(USER_CATALOG_ENV), settings.get(PROFILE_ENV))


def catalog() -> dict[str, DatasetSpec]:
    """The current catalog's dataset entries."""
    return current().datasets


def get_dataset(name: str) -> DatasetSpec:
    specs = catalog()
    if name not in specs:
        if name in current().files.table("datasets"):
            raise CatalogError(
                f"dataset {name!r} has no bundled sample ({SAMPLES_DIR / f'{name}.jsonl'}), so the "
                f"{settings.get(PROFILE_ENV)} profile leaves it out: set `source` in its catalog entry, or unset "
                f"{PROFILE_ENV}"
            )
        raise CatalogError(
            f"unknown dataset {name!r}; known: {', '.join(specs)} "
            f"(add a [datasets.{name}] entry to a catalog file named by ${USER_CATALOG_ENV})"
        )
    return specs[name]
