"""Engines fail fast with one line that names the endpoint and the fix, before any prompt is sent."""

import time
from pathlib import Path

import pytest

from eagle_data.engines import EngineSettings, build_engine, make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.standins.local import free_port
from eagle_data.standins.openai_fake import prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.types import ConfigError, FatalError


@pytest.mark.parametrize("kind", ["openai", "openrouter", "sglang"])
def test_unreachable_engine_url_is_a_one_line_error(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = (
        {"urls": (url,), "model": "m", "mode": "chat"} if kind == "sglang" else {"base_url": f"{url}/v1", "model": "m"}
    )
    if kind == "openrouter":
        settings["api_key_env"] = "EAGLE_TEST_UNUSED_KEY"
        monkeypatch.setenv("EAGLE_TEST_UNUSED_KEY", "unused")
    started = time.monotonic()
    with pytest.raises(FatalError) as err:
        run_generation(
            make_engine(kind, **settings),
            spec_for_tests(),
            prompt_shards(1, 3),
            ShardStore(str(tmp_path)),
            settings=RunnerSettings(progress_bar=False),
            log=lambda line: None,
        )
    message = str(err.value)
    assert url in message and "\n" not in message
    assert time.monotonic() - started < 30
    assert ShardStore(str(tmp_path)).list("b7_sharegpt") == []


@pytest.mark.parametrize(
    ("kind", "model", "named"),
    [("openrouter", "", "EAGLE_DATA_MODEL"), ("sglang", "", "EAGLE_DATA_MODEL"), ("sglang", "m", "EAGLE_DATA_BASE_URL"),
     ("openai", "m", "EAGLE_DATA_BASE_URL")],
)  # fmt: skip
def test_missing_engine_settings_name_the_variable_to_set(kind: str, model: str, named: str):
    with pytest.raises(FatalError, match=f"set {named}") as err:
        build_engine(EngineSettings(kind=kind, model=model), spec_for_tests())
    assert "\n" not in str(err.value)


def test_provider_routing_and_reasoning_from_the_environment_reach_the_request(monkeypatch: pytest.MonkeyPatch):
    from eagle_data.defs.resources import EngineResource

    monkeypatch.setenv("EAGLE_DATA_ENGINE", "openrouter")
    monkeypatch.setenv("EAGLE_DATA_MODEL", "qwen/qwen3-8b")
    monkeypatch.setenv("EAGLE_DATA_PROVIDER", '{"ignore": ["Fireworks", "BaseTen"], "quantizations": ["fp8", "bf16"]}')
    monkeypatch.setenv("EAGLE_DATA_REASONING", '{"effort": "high"}')
    config = EngineResource().make(spec_for_tests()).config()
    assert config["provider"] == {"ignore": ["Fireworks", "BaseTen"], "quantizations": ["fp8", "bf16"]}
    assert config["reasoning"] == {"effort": "high"} and config["model"] == "qwen/qwen3-8b"
    monkeypatch.setenv("EAGLE_DATA_PROVIDER", "{ignore: Fireworks}")
    with pytest.raises(ConfigError, match="EAGLE_DATA_PROVIDER is not JSON"):
        EngineResource().settings()
