"""Generation backends behind the `types.Engine` protocol, built by kind with `make_engine`.

Each kind maps to a small builder that imports its module lazily, so importing this package never
pulls torch or sglang. Settings are the engine's keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eagle_data.types import Engine, FatalError

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec
    from eagle_data.runner import RunnerSettings


def _openai(**settings: Any) -> Engine:
    from eagle_data.engines.openai_compat import OpenAICompatEngine

    if not settings.get("base_url"):  # never fall back to another provider's URL: the key would go there
        raise FatalError("engine openai needs a base URL: set EAGLE_DATA_BASE_URL (e.g. http://host:30000/v1)",
                         kind="config")  # fmt: skip
    return OpenAICompatEngine(name="openai", **settings)


def _openrouter(**settings: Any) -> Engine:
    from eagle_data.engines.openai_compat import OPENROUTER_KEY_ENV, OPENROUTER_URL, OpenAICompatEngine

    settings.setdefault("base_url", OPENROUTER_URL)
    settings.setdefault("api_key_env", OPENROUTER_KEY_ENV)
    return OpenAICompatEngine(name="openrouter", **settings)


def _local(*, model: str = "", device: str = "cpu", **settings: Any) -> Engine:
    from eagle_data.catalog import Generation
    from eagle_data.demo import ensure_demo_model
    from eagle_data.engines.local import LocalEngine

    sampling = {k: v for k, v in settings.items() if k in Generation.model_fields}
    return LocalEngine(model or ensure_demo_model(), Generation(**sampling), device=device)


def _sglang(*, codec: Any = None, **settings: Any) -> Engine:
    """`codec`: the target's eagle_data.engines.sglang.Codec (needed by mode "generate")."""
    from eagle_data.engines.sglang import SGLangEngine, SGLangSettings

    return SGLangEngine(SGLangSettings(**settings), codec)


ENGINE_KINDS: dict[str, Callable[..., Engine]] = {
    "openai": _openai,
    "openrouter": _openrouter,
    "local": _local,
    "sglang": _sglang,
}


def make_engine(kind: str, **settings: Any) -> Engine:
    """An engine of `kind` ("openai", "openrouter", ...) built from its keyword settings."""
    if kind not in ENGINE_KINDS:
        raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(sorted(ENGINE_KINDS))}")
    return ENGINE_KINDS[kind](**settings)


def engine_for(
    kind: str,
    spec: DatasetSpec,
    *,
    model: str = "",
    base_url: str = "",
    api_key_env: str = "",
    timeout_s: float = 0.0,
    provider: dict[str, Any] | None = None,
    reasoning: dict[str, Any] | None = None,
) -> Engine:
    """The engine of `kind` set up for one catalog dataset: its sampling settings and its target.

    `timeout_s` 0 keeps the engine's own per-request default.
    """
    g = spec.generation
    if kind in ("openai", "openrouter", "sglang") and not model:
        raise FatalError(f"engine {kind} needs a model: set EAGLE_DATA_MODEL (e.g. Qwen/Qwen3-8B)", kind="config")
    if kind == "sglang" and not base_url.strip():
        raise FatalError("engine sglang needs server URLs: set EAGLE_DATA_BASE_URL to comma-separated "
                         "http://host:port URLs (or one sglang-router URL)", kind="config")  # fmt: skip
    timeout = {"timeout_s": timeout_s} if timeout_s else {}
    sampling = {"max_tokens": g.max_tokens, "temperature": g.temperature, "top_p": g.top_p, "thinking": g.thinking}
    if kind == "local":
        return make_engine("local", model=model, min_tokens=g.min_tokens, **sampling)
    if kind == "sglang":
        from eagle_data.engines.sglang import codec_for
        from eagle_data.targets import load_target

        urls = tuple(url.strip() for url in base_url.split(",") if url.strip())
        timeout = {"request_timeout_s": timeout_s} if timeout_s else {}
        return make_engine("sglang", urls=urls, model=model, codec=codec_for(load_target(spec.target)),
                           min_tokens=g.min_tokens, **timeout, **sampling)  # fmt: skip
    endpoint = {"model": model, "base_url": base_url, "api_key_env": api_key_env, "provider": provider,
                "reasoning": reasoning}  # fmt: skip
    return make_engine(kind, **timeout, **{k: v for k, v in endpoint.items() if v}, **sampling)


def runner_settings_for(kind: str, max_in_flight: int = 0) -> RunnerSettings:
    """In-flight limits per kind: a paid API ramps up from a low start; servers we own start at full width."""
    from eagle_data.runner import RunnerSettings

    if kind == "local":  # one model in this process: a short queue keeps the log honest
        return RunnerSettings(max_in_flight=4, initial_in_flight=4, min_in_flight=1)
    if kind == "sglang":
        width = max_in_flight or 512
        return RunnerSettings(max_in_flight=width, initial_in_flight=width, min_in_flight=min(4, width))
    return RunnerSettings(max_in_flight=max_in_flight or 2000)
