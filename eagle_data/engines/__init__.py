"""The engine registry: one `EngineKind` record per kind, declared in the kind's own module.

This package holds only the registry, its lookup and the kind-neutral settings. Each backend module
registers its kinds with `register(EngineKind(...))` when it is imported; the built-in modules are
imported on the first lookup, so importing this package never pulls torch or aiohttp. Everything else
(the Dagster resource, the pool of the generation asset, runner defaults, error messages) reads the
records, so adding a kind is one record in one module; and each setting is declared once, on its
`EngineSettings` field, so adding a setting is one field here (and the kinds that take it).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from eagle_data import settings
from eagle_data.types import ConfigError, Engine, SamplingRefused

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec

BUILTIN_MODULES = (
    "eagle_data.engines.local",
    "eagle_data.engines.openai_compat",
    "eagle_data.engines.sglang",
    "eagle_data.engines.vllm",
)


ENGINE_ENV = "EAGLE_DATA_ENGINE"


def _text(variable: str, text: str) -> str:
    return text


def _positive(number: type[int] | type[float]) -> Callable[[str, str], Any]:
    """A parser of a number > 0 (a timeout, a ceiling)."""

    def parse(variable: str, text: str) -> Any:
        try:
            value = number(text)
        except ValueError:
            raise ConfigError(f"{variable}={text!r} is not a number: give e.g. {variable}=120") from None
        if value <= 0:
            raise ConfigError(f"{variable} must be > 0, got {text}")
        return value

    return parse


def _json_object(variable: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f'{variable} is not JSON ({exc.msg} at char {exc.pos}): give an object like {{"sort": "price"}}'
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f'{variable} must be a JSON object, e.g. {{"sort": "price"}}')
    return value


@dataclass(frozen=True)
class Setting:
    """How one `EngineSettings` field is given: its one declaration, from which the Dagster resource's field
    (defs/resources.py), the environment's reading (`from_environment`) and the refusals derive.

    Attributes:
        description: what it is, for the UI's config schema and the docs.
        env: the environment variable it is read from ("": run config only).
        parse: (variable, text) -> value; a one-line ConfigError for a bad value.
        optional: a kind takes it only if its record lists it (`EngineKind.takes`); False: every kind does.
        by_name: it may hold a secret (a URL with a password), so run config carries the NAME of a variable
            holding it (`<name>_env`), never the value: Dagster stores run config as given.
    """

    description: str
    env: str = ""
    parse: Callable[[str, str], Any] = _text
    optional: bool = True
    by_name: bool = False

    def config_name(self, name: str) -> str:
        """The run config field that gives setting `name`."""
        return f"{name}_env" if self.by_name else name


def _declares(setting: Setting) -> dict[str, Setting]:
    """An `EngineSettings` field's metadata: its one declaration."""
    return {"setting": setting}


@dataclass(frozen=True)
class EngineSettings:
    """Kind-neutral engine settings, resolved at run time (run config over the environment, field by field).

    Each field declares itself once (a `Setting`, in its metadata). `kind`, `model` and `max_in_flight` mean
    something to every kind; each other field only to the kinds whose record lists it in `EngineKind.takes`
    (given to another kind, it is refused, never dropped). None: the kind's default.
    """

    # fmt: off
    kind: str = field(metadata=_declares(Setting(
        "Engine kind: set where the code location starts; run config may only repeat it", ENGINE_ENV,
        optional=False)))
    model: str = field(default="", metadata=_declares(Setting(
        "Served model name; local: a checkpoint folder", "EAGLE_DATA_MODEL", optional=False)))
    base_url: str = field(default="", metadata=_declares(Setting(
        "the API base URL or comma-separated server URLs", "EAGLE_DATA_BASE_URL", by_name=True)))
    api_key_env: str | None = field(default=None, metadata=_declares(Setting(
        "Name of the variable holding the API key (never the key); default the kind's; '' for none")))
    timeout_s: float | None = field(default=None, metadata=_declares(Setting(
        "Whole-request timeout, seconds: a server dripping bytes cannot stretch it", "EAGLE_DATA_TIMEOUT_S",
        _positive(float))))
    connect_timeout_s: float | None = field(default=None, metadata=_declares(Setting(
        "Connect timeout, seconds: a dead host fails fast", "EAGLE_DATA_CONNECT_TIMEOUT_S", _positive(float))))
    max_in_flight: int | None = field(default=None, metadata=_declares(Setting(
        "Ceiling of concurrent requests", "EAGLE_DATA_MAX_IN_FLIGHT", _positive(int), optional=False)))
    provider: dict[str, Any] | None = field(default=None, metadata=_declares(Setting(
        "OpenRouter provider routing, e.g. {ignore: [Fireworks]}", "EAGLE_DATA_PROVIDER", _json_object)))
    reasoning: dict[str, Any] | None = field(default=None, metadata=_declares(Setting(
        "OpenRouter reasoning request, e.g. {effort: high}", "EAGLE_DATA_REASONING", _json_object)))
    batch_size: int | None = field(default=None, metadata=_declares(Setting(
        "Most prompts generated together in one pass (local; default 16)", "EAGLE_DATA_BATCH_SIZE",
        _positive(int))))
    threads: int | None = field(default=None, metadata=_declares(Setting(
        "torch threads (local; default: the CPUs other processes leave free)", "EAGLE_DATA_THREADS",
        _positive(int))))
    # fmt: on

    def key_env(self) -> str:
        """The variable the key is read from ("" for none)."""
        return lookup(self.kind).key_env if self.api_key_env is None else self.api_key_env

    def timeouts(self) -> dict[str, float]:
        """The timeouts that were set, as engine keyword arguments (unset ones keep the engine's default)."""
        given = {"timeout_s": self.timeout_s, "connect_timeout_s": self.connect_timeout_s}
        return {name: value for name, value in given.items() if value is not None}


SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(EngineSettings)}
# The settings a kind may or may not take, with the variable each is read from ("" : run config only).
OPTIONAL_SETTINGS = {name: s.env for name, s in SETTINGS.items() if s.optional}


def from_environment() -> dict[str, Any]:
    """Every setting as the environment gives it (None where unset), parsed: the one reader of the engine's
    variables (at run time, never at import); a one-line ConfigError for a value that does not parse."""
    texts = {name: settings.get(s.env) if s.env else "" for name, s in SETTINGS.items()}
    return {name: SETTINGS[name].parse(SETTINGS[name].env, text) if text else None for name, text in texts.items()}


@dataclass(frozen=True)
class EngineKind:
    """Everything the project knows about one engine kind.

    Attributes:
        name: the registry name (EAGLE_DATA_ENGINE's value, the `engine` column, the default pool).
        build: the engine from resolved settings, set up for one catalog dataset (sampling, target).
        make: the engine from its own keyword arguments (tests, benchmarks, scripts).
        summary: a few words for listings and errors.
        key_env: the environment variable that holds its API key ("" when it needs none).
        required: setting name -> what to do when it is missing (one line, names the variable).
        max_in_flight: default ceiling of concurrent requests (raised to two batches where the kind takes
            a `batch_size` larger than half of it: `in_flight`).
        ramp: start low and ramp up (a paid API, so a cold start never causes a 429 storm), or start
            at full width (servers we own).
        demo: the kind the demo profile runs when no engine is chosen.
        pool: the Dagster pool of its generation steps ("" : the name).
        takes: the `EngineSettings` fields it uses beyond kind, model and max_in_flight; any other one set
            (from the environment or run config) is refused in one line.
        billing: how its dollars are known: "reported" (each reply's usage carries its cost), "free"
            (servers you run, paid by the hour, not the token) or "unknown" (a dollar budget needs a price).
    """

    name: str
    build: Callable[[EngineSettings, DatasetSpec], Engine]
    make: Callable[..., Engine]
    summary: str
    key_env: str = ""
    required: Mapping[str, str] = field(default_factory=dict)
    max_in_flight: int = 2000
    ramp: bool = True
    demo: bool = False
    pool: str = ""
    takes: frozenset[str] = frozenset()
    billing: str = "unknown"

    @property
    def pool_name(self) -> str:
        return self.pool or self.name

    def in_flight(self, settings: EngineSettings) -> int:
        """The ceiling of concurrent requests: the setting, else the kind's default, raised to two batches
        where a batch size is set (one generating, the next one filling up meanwhile)."""
        return settings.max_in_flight or max(self.max_in_flight, 2 * (settings.batch_size or 0))

    def missing(self, settings: EngineSettings) -> str | None:
        """One line saying which required setting is missing and how to set it, or None."""
        for name, fix in self.required.items():
            if not str(getattr(settings, name) or "").strip():
                return f"engine {self.name} needs {name}: {fix}"
        return None

    def refused(self, settings: EngineSettings) -> str | None:
        """One line naming a setting given that this kind does not take, or None."""
        for name in sorted(OPTIONAL_SETTINGS.keys() - self.takes):
            if getattr(settings, name) not in (None, ""):
                setting = SETTINGS[name]
                where = f"unset {setting.env} or " if setting.env else ""
                return (f"engine {self.name} takes no {name} setting: {where}remove {setting.config_name(name)} "
                        "from the engine's run config")  # fmt: skip
        return None


_KINDS: dict[str, EngineKind] = {}


def register(kind: EngineKind) -> EngineKind:
    """Add (or replace) a kind; called at import time by the module that defines it."""
    if unknown := kind.takes - OPTIONAL_SETTINGS.keys():
        raise ValueError(
            f"engine kind {kind.name} takes unknown settings {sorted(unknown)}: use {sorted(OPTIONAL_SETTINGS)}"
        )
    _KINDS[kind.name] = kind
    return kind


def kinds() -> dict[str, EngineKind]:
    """Every registered kind, by name."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    return dict(sorted(_KINDS.items()))


def lookup(name: str) -> EngineKind:
    """The record of kind `name`, or a one-line error listing the choices."""
    known = kinds()
    if name not in known:
        raise ConfigError(f"unknown engine kind {name!r}: set {ENGINE_ENV} to one of {', '.join(known)}")
    return known[name]


def demo_kind() -> EngineKind:
    """The kind the demo profile runs when no engine is chosen."""
    return next(kind for kind in kinds().values() if kind.demo)


def make_engine(kind: str, **arguments: Any) -> Engine:
    """An engine of `kind` from its own keyword arguments."""
    return lookup(kind).make(**arguments)


def build_engine(settings: EngineSettings, spec: DatasetSpec) -> Engine:
    """The engine the resolved `settings` ask for, set up for one dataset (with `target = "auto"`, for the
    profile its model maps to); a one-line error when a required setting is missing, a setting is given the
    kind does not take, the model maps to no profile, or the entry has a sampling mixture the engine cannot
    honour."""
    kind = lookup(settings.kind)
    if problem := kind.missing(settings) or kind.refused(settings):
        raise ConfigError(problem)
    if spec.target == "auto":  # the profile the model maps to, before any kind reads the target's markers
        from eagle_data.targets.profile import resolve_target  # here: importing this package loads no tokenizer

        spec = spec.model_copy(update={"target": resolve_target(spec.target, [settings.model])})
    engine = kind.build(settings, spec)
    if spec.generation.mixture and not engine.takes_sampling:
        raise SamplingRefused(kind.name, spec.name)
    return engine
