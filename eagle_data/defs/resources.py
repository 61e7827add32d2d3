"""Dagster resources: one per external system. Secrets arrive only through the environment: a field that
could carry one (a URL with a password, a key) takes the NAME of a variable, because Dagster stores run
config as given (the run's record, its events) before any step could refuse it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from eagle_data import settings
from eagle_data.catalog import PROFILE_ENV, DatasetSpec
from eagle_data.demo import demo_model_path
from eagle_data.engines import EngineSettings, build_engine, demo_kind, kinds, lookup
from eagle_data.runner import RunnerSettings
from eagle_data.storage import ShardStore, default_root
from eagle_data.types import Engine, FatalError

ENGINE_ENV = "EAGLE_DATA_ENGINE"
POOL_ENV = "EAGLE_DATA_POOL"
DEMO_PROFILE = "demo"
NO_ENGINE_POOL = "generation"  # the pool while no engine is chosen (a run then fails before any request)
ENGINE_VARIABLES = {"kind": ENGINE_ENV, "model": "EAGLE_DATA_MODEL", "base_url": "EAGLE_DATA_BASE_URL"}


class S3ClientResource(dg.ConfigurableResource):
    """S3 client settings: the non-secret fields of dagster-aws's S3Resource, which builds the client.
    Credentials come from the AWS_* environment only (S3Resource's key fields would put them in run config).
    dagster-aws is imported with this module, once per run in the forkserver that starts steps
    (STEP_PRELOAD), so a step pays only for its client (docs/facts.md, "What dagster-aws and boto3 cost")."""

    endpoint_url: str | None = Field(None, description="A custom endpoint (MinIO, moto); empty: AWS's.")
    region_name: str | None = Field(None, description="The region; empty: the AWS_* environment's.")
    profile_name: str | None = Field(None, description="A profile of ~/.aws/config.")
    max_attempts: int = Field(5, description="Retries per call after the first (botocore's standard retry mode).")
    use_ssl: bool = Field(True, description="Whether to use SSL.")
    verify: bool | None = Field(None, description="Whether to verify SSL certificates (default: verified).")
    use_unsigned_session: bool = Field(False, description="Send unsigned requests (public buckets).")

    def get_client(self) -> Any:
        return S3Resource(**self.model_dump()).get_client()


class StorageResource(dg.ConfigurableResource):
    """Where shards live: a local folder (default ./eagle-output) or s3://bucket/prefix."""

    root: str = Field("", description="Folder or s3://bucket/prefix; empty: $EAGLE_DATA_ROOT or ./eagle-output.")
    s3: S3ClientResource = Field(
        default_factory=S3ClientResource,
        description="S3 client settings (endpoint_url for MinIO); credentials from the AWS_* environment.",
    )

    def store(self, check: bool = True) -> ShardStore:
        """The store, checked: a root that cannot take shards is one line here, before an asset spends
        (`check` False: the shard IO manager's, which runs after or before a body that checks)."""
        store = ShardStore(self.root or default_root(), s3_client_factory=self.s3.get_client)
        if check:
            store.check()
        return store


class EngineResource(dg.ConfigurableResource):
    """The generation backend, kind-neutral: every field is optional and resolved at run time, field by
    field: a value given in run config wins, else the environment's (`engine_environment`), else the
    kind's default. The kind is always the environment's: run config may repeat it, never change it."""

    kind: str | None = Field(
        None,
        description="Engine kind: set by EAGLE_DATA_ENGINE where the code location starts; run config may "
        "only repeat it.",
    )
    model: str | None = Field(None, description="Served model name (EAGLE_DATA_MODEL); local: a checkpoint folder.")
    base_url_env: str | None = Field(
        None,
        description="Name of the variable holding the API base URL or comma-separated server URLs (default "
        "EAGLE_DATA_BASE_URL). Never the URL: Dagster stores run config as given, and a URL may carry a password.",
    )
    api_key_env: str | None = Field(
        None, description="Name of the variable holding the API key (never the key); default the kind's; '' for none."
    )
    timeout_s: float | None = Field(None, description="Whole-request timeout, seconds (EAGLE_DATA_TIMEOUT_S).")
    connect_timeout_s: float | None = Field(
        None, description="Connect timeout, seconds (EAGLE_DATA_CONNECT_TIMEOUT_S): a dead host fails fast."
    )
    max_in_flight: int | None = Field(None, description="Ceiling of concurrent requests (EAGLE_DATA_MAX_IN_FLIGHT).")
    provider: dict[str, Any] | None = Field(
        None, description="OpenRouter provider routing (EAGLE_DATA_PROVIDER), e.g. {ignore: [Fireworks]}."
    )
    reasoning: dict[str, Any] | None = Field(
        None, description="OpenRouter reasoning request (EAGLE_DATA_REASONING), e.g. {effort: high}."
    )

    def settings(self) -> EngineSettings:
        """The resolved settings; a one-line error when no engine was chosen, or when run config names
        another kind than the environment's (the generation step's pool was fixed from it at load). Only
        the demo profile fills in a model for its kind: the demo checkpoint."""
        env = engine_environment()
        kind = environment_kind()
        given = {name: value for name, value in self.model_dump().items() if value is not None}
        if (asked := given.pop("kind", None)) and asked != kind:
            raise FatalError(
                f"run config asks for engine {asked}, but this code location runs {kind or 'none'}: set "
                f"{ENGINE_ENV}={asked} and restart the code server, or remove kind from the run config",
                kind="config",
            )
        if not kind:
            raise FatalError(
                f"no engine chosen: set {ENGINE_ENV} to one of {', '.join(kinds())} "
                f"(or {PROFILE_ENV}=demo for the local demo model)",
                kind="config",
            )
        if (url_env := given.pop("base_url_env", None)) is not None:
            if env.demo and kind == demo_kind().name:
                raise FatalError(
                    f"run config sets base_url_env, but the {kind} engine of the demo profile serves in this "
                    f"process and takes no URL: remove it, or set {ENGINE_ENV} to a served kind",
                    kind="config",
                )
            given["base_url"] = settings.get(url_env)
            if not given["base_url"]:
                raise FatalError(
                    f"run config base_url_env names {url_env}, which is empty: export the server's URL there",
                    kind="config",
                )
        values = {**{k: v for k, v in env.settings.items() if v is not None}, **given, "kind": kind}
        if env.demo and kind == demo_kind().name and not values.get("model"):
            values["model"] = str(demo_model_path())
        return EngineSettings(**values)

    def make(self, spec: DatasetSpec) -> Engine:
        return build_engine(self.settings(), spec)

    def runner_settings(self) -> RunnerSettings:
        settings = self.settings()
        kind = lookup(settings.kind)
        return RunnerSettings.in_flight(settings.max_in_flight or kind.max_in_flight, ramp=kind.ramp)


@dataclass(frozen=True)
class EngineEnvironment:
    """What the environment says about the engine: settings (None where unset), the profile's demo
    switch, and an explicit pool name."""

    settings: dict[str, Any]
    demo: bool
    pool: str


def engine_environment() -> EngineEnvironment:
    """The one place the engine's environment variables are read (at run time, never at import)."""
    text = {name: settings.get(var) or None for name, var in ENGINE_VARIABLES.items()}
    return EngineEnvironment(
        settings={
            **text,
            "timeout_s": _number_env("EAGLE_DATA_TIMEOUT_S", float),
            "connect_timeout_s": _number_env("EAGLE_DATA_CONNECT_TIMEOUT_S", float),
            "max_in_flight": _number_env("EAGLE_DATA_MAX_IN_FLIGHT", int),
            "provider": _json_env("EAGLE_DATA_PROVIDER"),
            "reasoning": _json_env("EAGLE_DATA_REASONING"),
        },
        demo=settings.get(PROFILE_ENV) == DEMO_PROFILE,
        pool=settings.get(POOL_ENV),
    )


def environment_kind() -> str | None:
    """The environment's engine kind, or the demo kind on the demo profile; None when neither names one."""
    env = engine_environment()
    return env.settings["kind"] or (demo_kind().name if env.demo else None)


def generation_pool() -> str:
    """The Dagster pool of generation steps: $EAGLE_DATA_POOL, else the pool of the environment's kind.
    Dagster fixes an asset's pool when the definitions load, so the asset reads this once then;
    `EngineResource.settings` refuses a run whose kind is not the environment's."""
    kind = environment_kind()
    return engine_environment().pool or (lookup(kind).pool_name if kind else NO_ENGINE_POOL)


def _number_env(name: str, kind: type[int] | type[float]) -> Any:
    text = settings.get(name)
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number: give e.g. {name}=120") from None
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {text}")
    return value


def _json_env(name: str) -> dict[str, Any] | None:
    text = settings.get(name)
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f'{name} is not JSON ({exc.msg} at char {exc.pos}): give an object like {{"sort": "price"}}'
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f'{name} must be a JSON object, e.g. {{"sort": "price"}}')
    return value
