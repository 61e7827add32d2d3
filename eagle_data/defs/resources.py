"""Dagster resources: one per external system. Secrets arrive only through the environment: a field that
could carry one (a URL with a password, a key) takes the NAME of a variable, because Dagster stores run
config as given (the run's record, its events) before any step could refuse it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_type_hints

import dagster as dg
from pydantic import Field, create_model

from eagle_data import settings
from eagle_data.catalog import PROFILE_ENV, DatasetSpec
from eagle_data.demo import ensure_demo_model
from eagle_data.engines import (
    ENGINE_ENV,
    SETTINGS,
    EngineSettings,
    Setting,
    build_engine,
    demo_kind,
    from_environment,
    kinds,
    lookup,
)
from eagle_data.runner import RunnerSettings
from eagle_data.storage import ShardStore, default_root
from eagle_data.types import ConfigError, Engine

POOL_ENV = "EAGLE_DATA_POOL"
DEMO_PROFILE = "demo"
NO_ENGINE_POOL = "generation"  # the pool while no engine is chosen (a run then fails before any request)


class S3ClientResource(dg.ConfigurableResource):
    """S3 client settings: the non-secret fields of dagster-aws's S3Resource, which builds the client.
    Credentials come from the AWS_* environment only (S3Resource's key fields would put them in run config).
    dagster-aws is imported when a client is built, not with this module: a process on a local root (a CLI
    run, a code server) never pays for it; the forkserver that starts steps preloads it (STEP_PRELOAD), so a
    step pays only for its client (docs/facts.md, "What dagster-aws and boto3 cost")."""

    endpoint_url: str | None = Field(None, description="A custom endpoint (MinIO, moto); empty: AWS's.")
    region_name: str | None = Field(None, description="The region; empty: the AWS_* environment's.")
    profile_name: str | None = Field(None, description="A profile of ~/.aws/config.")
    max_attempts: int = Field(5, description="Retries per call after the first (botocore's standard retry mode).")
    use_ssl: bool = Field(True, description="Whether to use SSL.")
    verify: bool | None = Field(None, description="Whether to verify SSL certificates (default: verified).")
    use_unsigned_session: bool = Field(False, description="Send unsigned requests (public buckets).")

    def get_client(self, endpoint_url: str | None = None) -> Any:
        """The client; `endpoint_url` replaces the configured one (the address presigned links name)."""
        from dagster_aws.s3 import S3Resource

        fields = self.model_dump()
        return S3Resource(**{**fields, "endpoint_url": endpoint_url or fields["endpoint_url"]}).get_client()


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
        store = ShardStore(
            self.root or default_root(), s3_client_factory=self.s3.get_client, s3_link_factory=self.s3.get_client
        )
        if check:
            store.check()
        return store


class _EngineResolver(dg.ConfigurableResource):
    """The resolution of `EngineResource`'s fields (which are derived from `EngineSettings`, below): every
    field is optional and resolved at run time, field by field: a value given in run config wins, else the
    environment's (`engine_environment`), else the kind's default. The kind is always the environment's:
    run config may repeat it, never change it."""

    def settings(self) -> EngineSettings:
        """The resolved settings; a one-line error when no engine was chosen, or when run config names
        another kind than the environment's (the generation step's pool was fixed from it at load). Only
        the demo profile fills in a model for its kind: the demo checkpoint."""
        env = engine_environment()
        kind = environment_kind()
        given = {name: value for name, value in self.model_dump().items() if value is not None}
        if (asked := given.pop("kind", None)) and asked != kind:
            raise ConfigError(
                f"run config asks for engine {asked}, but this code location runs {kind or 'none'}: set "
                f"{ENGINE_ENV}={asked} and restart the code server, or remove kind from the run config"
            )
        if not kind:
            raise ConfigError(
                f"no engine chosen: set {ENGINE_ENV} to one of {', '.join(kinds())} "
                f"(or {PROFILE_ENV}=demo for the local demo model)"
            )
        demo = env.demo and kind == demo_kind().name
        for name, setting in SETTINGS.items():
            if setting.by_name and (variable := given.pop(setting.config_name(name), None)) is not None:
                given[name] = _named_value(setting.config_name(name), variable, kind if demo else "")
        values = {**{k: v for k, v in env.settings.items() if v is not None}, **given, "kind": kind}
        if demo and not values.get("model"):
            values["model"] = str(ensure_demo_model())  # built on first use: its target is derived from it
        return EngineSettings(**values)

    def make(self, spec: DatasetSpec) -> Engine:
        return build_engine(self.settings(), spec)

    def runner_settings(self) -> RunnerSettings:
        settings = self.settings()
        kind = lookup(settings.kind)
        return RunnerSettings.in_flight(kind.in_flight(settings), ramp=kind.ramp)


def _named_value(field_name: str, variable: str, demo_kind_name: str) -> str:
    """The value of the variable a by-name field (`base_url_env`) names; a one-line error when it is empty,
    or when the demo profile's in-process engine is asked to take it."""
    if demo_kind_name:
        raise ConfigError(
            f"run config sets {field_name}, but the {demo_kind_name} engine of the demo profile serves in this "
            f"process and takes no URL: remove it, or set {ENGINE_ENV} to a served kind"
        )
    if not (value := settings.get(variable)):
        raise ConfigError(f"run config {field_name} names {variable}, which is empty: export the server's URL there")
    return value


def _engine_field(name: str, setting: Setting, hint: Any) -> tuple[Any, Any]:
    """The resource's pydantic field for one declared setting: optional, with the declaration's description."""
    if setting.by_name:
        description = (
            f"Name of the variable holding {setting.description} (default {setting.env}). Never the value: "
            "Dagster stores run config as given, and it may carry a password."
        )
        return str | None, Field(None, description=description)
    where = f" ({setting.env})" if setting.env else ""
    return hint | None, Field(None, description=f"{setting.description}{where}.")


_HINTS = get_type_hints(EngineSettings)
EngineResource = create_model(
    "EngineResource",
    __base__=_EngineResolver,
    __module__=__name__,
    __doc__="The generation backend, kind-neutral: one optional field per `EngineSettings` field, built from its "
    "declaration (engines/__init__.py); resolved as `_EngineResolver` says.",
    **{s.config_name(name): _engine_field(name, s, _HINTS[name]) for name, s in SETTINGS.items()},
)


@dataclass(frozen=True)
class EngineEnvironment:
    """What the environment says about the engine: settings (None where unset), the profile's demo
    switch, and an explicit pool name."""

    settings: dict[str, Any]
    demo: bool
    pool: str


def engine_environment() -> EngineEnvironment:
    """What the environment says about the engine, read at run time (never at import)."""
    return EngineEnvironment(
        settings=from_environment(), demo=settings.get(PROFILE_ENV) == DEMO_PROFILE, pool=settings.get(POOL_ENV)
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
