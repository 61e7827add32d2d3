"""`target = "auto"` resolves the served model's profile before any engine kind reads the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_data.engines import EngineSettings, build_engine
from eagle_data.standins.openai_fake import spec_for_tests
from eagle_data.targets.reasoning import reasoning_markers
from eagle_data.types import FatalError

MODEL = "Qwen/Qwen3-8B"  # targets.toml [served_models]: "*qwen/qwen3-*" = "qwen3"


@pytest.mark.parametrize("kind", ["openai", "openrouter", "vllm"])
def test_auto_builds_each_http_engine_with_the_served_models_markers(kind: str) -> None:
    """#34.6: building the engine read reasoning markers for the literal name "auto" ("unknown target 'auto'")."""
    engine = build_engine(EngineSettings(kind=kind, model=MODEL, base_url="http://127.0.0.1:9/v1"),
                          spec_for_tests(target="auto"))  # fmt: skip
    assert engine.model == MODEL
    assert getattr(engine, "markers", None) == reasoning_markers("qwen3")


def test_auto_on_the_local_engine_gets_past_the_target_to_the_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / MODEL  # a local checkpoint folder named like the served model
    with pytest.raises(FatalError, match="no checkpoint at"):
        build_engine(EngineSettings(kind="local", model=str(folder)), spec_for_tests(target="auto"))
