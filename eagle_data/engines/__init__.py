"""The engine registry: one `EngineKind` record per kind, declared in the kind's own module.

This package holds only the registry and its lookup. Each backend module registers its kinds with
`register(EngineKind(...))` when it is imported; the built-in modules are imported on the first
lookup, so importing this package never pulls torch or aiohttp. Everything else (the Dagster
resource, the pool of the generation asset, runner defaults, error messages) reads the records, so
adding a kind is one record in one module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eagle_data.types import ConfigError, Engine, FatalError

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec

BUILTIN_MODULES = (
    "eagle_data.engines.local",
    "eagle_data.engines.openai_compat",
    "eagle_data.engines.sglang",
    "eagle_data.engines.vllm",
)


@dataclass(frozen=True)
class EngineSettings:
    """Kind-neutral engine settings, resolved at run time (run config over the environment, field by field).

    Attributes:
        kind: the registry name of the engine kind.
        model: served model name (for a local kind, a checkpoint folder; empty: its default).
        base_url: API base URL, or comma-separated server URLs for a fleet kind.
        api_key_env: name of the environment variable holding the API key; None: the kind's own
            (`EngineKind.key_env`); "": send no key (a local server without auth).
        timeout_s: seconds one request may take, whole answer included, before the attempt fails (a server
            dripping bytes cannot stretch it); None: the kind's default.
        connect_timeout_s: seconds to open a connection, so a dead host fails fast; None: the kind's default.
        max_in_flight: ceiling of concurrent requests; None: the kind's default.
        provider: OpenRouter-style provider routing, for kinds that take it.
        reasoning: OpenRouter-style reasoning request, for kinds that take it.

    `kind`, `model` and `max_in_flight` mean something to every kind; each other field only to the kinds
    whose record lists it in `EngineKind.takes` (given to another kind, it is refused, never dropped).
    """

    kind: str
    model: str = ""
    base_url: str = ""
    api_key_env: str | None = None
    timeout_s: float | None = None
    connect_timeout_s: float | None = None
    max_in_flight: int | None = None
    provider: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None

    def key_env(self) -> str:
        """The variable the key is read from ("" for none)."""
        return lookup(self.kind).key_env if self.api_key_env is None else self.api_key_env

    def timeouts(self) -> dict[str, float]:
        """The timeouts that were set, as engine keyword arguments (unset ones keep the engine's default)."""
        given = {"timeout_s": self.timeout_s, "connect_timeout_s": self.connect_timeout_s}
        return {name: value for name, value in given.items() if value is not None}


# The EngineSettings fields a kind may or may not take, with the environment variable each is read from
# ("" : run config only).
OPTIONAL_SETTINGS = {
    "base_url": "EAGLE_DATA_BASE_URL", "api_key_env": "", "timeout_s": "EAGLE_DATA_TIMEOUT_S",
    "connect_timeout_s": "EAGLE_DATA_CONNECT_TIMEOUT_S", "provider": "EAGLE_DATA_PROVIDER",
    "reasoning": "EAGLE_DATA_REASONING",
}  # fmt: skip


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
        max_in_flight: default ceiling of concurrent requests.
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
                where = f"unset {OPTIONAL_SETTINGS[name]} or " if OPTIONAL_SETTINGS[name] else ""
                return f"engine {self.name} takes no {name} setting: {where}remove {name} from the engine's run config"
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
        raise FatalError(
            f"unknown engine kind {name!r}: set EAGLE_DATA_ENGINE to one of {', '.join(known)}", kind="config"
        )
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
        raise FatalError(problem, kind="config")
    if spec.target == "auto":  # the profile the model maps to, before any kind reads the target's markers
        from eagle_data.targets.profile import resolve_target  # here: importing this package loads no tokenizer

        spec = spec.model_copy(update={"target": resolve_target(spec.target, [settings.model])})
    engine = kind.build(settings, spec)
    if spec.generation.mixture and not engine.takes_sampling:
        raise sampling_refused(kind.name, spec.name)
    return engine


def sampling_refused(kind: str, dataset: str = "") -> ConfigError:
    """The one-line error for a per-request sampling setting (a catalog sampling mixture) given to an engine
    that cannot honour it."""
    return ConfigError(
        f"{dataset + ': ' if dataset else ''}engine {kind} takes no per-request sampling settings; remove the "
        "catalog entry's generation.mixture or use an OpenAI-compatible engine (openai, openrouter, vllm)"
    )
