"""Dagster resources: one per external system. Secrets arrive only through `dg.EnvVar`."""

from __future__ import annotations

import json
import os
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from eagle_data.catalog import DatasetSpec
from eagle_data.engines import engine_for, runner_settings_for
from eagle_data.runner import RunnerSettings
from eagle_data.storage import ShardStore, default_root
from eagle_data.types import Engine

ENGINE_ENV = "EAGLE_DATA_ENGINE"


class StorageResource(dg.ConfigurableResource):
    """Where shards live: a local folder (default ./eagle-output) or s3://bucket/prefix."""

    root: str = Field("", description="Folder or s3://bucket/prefix; empty: $EAGLE_DATA_ROOT or ./eagle-output.")
    s3: S3Resource = Field(
        default_factory=S3Resource,
        description="S3 client settings (endpoint_url for MinIO); credentials from the AWS_* environment.",
    )

    def store(self) -> ShardStore:
        return ShardStore(self.root or default_root(), s3_client_factory=self.s3.get_client)


class EngineResource(dg.ConfigurableResource):
    """The generation backend: the embedded local model, an OpenAI-compatible API, or an SGLang fleet."""

    kind: str = Field("local", description="local | openai | openrouter | sglang")
    model: str = Field("", description="Served model name; for `local` a checkpoint folder (default: the demo).")
    base_url: str = Field("", description="API base URL (openai/openrouter), or comma-separated SGLang servers.")
    api_key_env: str = Field("", description="Name of the environment variable holding the API key (never the key).")
    timeout_s: float = Field(0.0, description="Per-request timeout in seconds; 0: the engine's default.")
    max_in_flight: int = Field(0, description="Ceiling of concurrent requests; 0: the engine's default.")
    provider: dict[str, Any] | None = Field(
        None, description="OpenRouter provider routing, e.g. {ignore: [Fireworks], quantizations: [fp8, bf16]}."
    )
    reasoning: dict[str, Any] | None = Field(
        None, description="OpenRouter reasoning request, e.g. {effort: high} or {max_tokens: 8192}."
    )

    def make(self, spec: DatasetSpec) -> Engine:
        return engine_for(self.kind, spec, model=self.model, base_url=self.base_url, api_key_env=self.api_key_env,
                          timeout_s=self.timeout_s, provider=self.provider, reasoning=self.reasoning)  # fmt: skip

    def runner_settings(self) -> RunnerSettings:
        return runner_settings_for(self.kind, self.max_in_flight)


def engine_from_env() -> EngineResource:
    """The engine the code location starts with: $EAGLE_DATA_ENGINE (default the embedded local model)."""
    kind = os.environ.get(ENGINE_ENV, "local")
    return EngineResource(
        kind=kind,
        model=os.environ.get("EAGLE_DATA_MODEL", ""),
        base_url=os.environ.get("EAGLE_DATA_BASE_URL", ""),
        api_key_env={"openrouter": "OPENROUTER_API_KEY", "openai": "OPENAI_API_KEY"}.get(kind, ""),
        provider=_json_env("EAGLE_DATA_PROVIDER"),
        reasoning=_json_env("EAGLE_DATA_REASONING"),
    )


def _json_env(name: str) -> dict[str, Any] | None:
    text = os.environ.get(name, "").strip()
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
