"""One shared demo run per test session: `eagle-data demo` as a newcomer runs it (every shard of b7_sharegpt's
prompts, generation and validated, a process per step, the repository's dagster.yaml), then `training_mix`,
once. Every test that only reads what a demo run leaves (its shards, its export, its summary, its instance)
reads this run instead of running the demo again.

The model it runs is one setting: `EAGLE_TEST_DEMO_RUN_MODEL` (a transformers folder), by default the demo's own
model, SmolLM2-135M-Instruct (the `smollm2` fixture): the demo profile's gates are set for a real instruct model's
replies, which the random-weight stand-in (`demo_model`, for tests that need speed, not text) does not pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DEMO_RUN_MODEL_ENV = "EAGLE_TEST_DEMO_RUN_MODEL"
DEMO_DATASET = "b7_sharegpt"
# The run's bound: 4 1/2 minutes idle on 2 cores, over 25 at load 10 (SmolLM2 generating on what the busy
# machine leaves it); the tests that read it carry the same bound (test_definitions.py).
DEMO_RUN_TIMEOUT_S = 3600


@dataclass(frozen=True)
class DemoRun:
    """What the shared demo run left: its exit status and printed summary, its output root, its Dagster home
    (instance and log), and the environment it ran in (for a test that asks the same instance more)."""

    code: int
    printed: str
    root: Path
    home: Path
    env: dict[str, str]
    model: Path


@pytest.fixture(scope="session")
def demo_run_model(request: pytest.FixtureRequest) -> Path:
    """The model the shared demo run generates with: the one setting to change it."""
    chosen = os.environ.get(DEMO_RUN_MODEL_ENV)
    return Path(chosen) if chosen else request.getfixturevalue("smollm2")


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory, demo_run_model: Path) -> DemoRun:
    from eagle_data_tests.conftest import materialize_cli

    base = tmp_path_factory.mktemp("demo-run")
    home, root = base / "home", base / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(home), EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(root),
               EAGLE_DATA_DEMO_MODEL=str(demo_run_model))  # fmt: skip
    demo = subprocess.run([sys.executable, "-c", "from eagle_data.cli import main; raise SystemExit(main(['demo']))"],
                          env=env, capture_output=True, text=True, timeout=DEMO_RUN_TIMEOUT_S, cwd=base)  # fmt: skip
    if demo.returncode == 0:
        mix = materialize_cli(env, "--select", "training_mix", timeout_s=600)
        assert mix.returncode == 0, (mix.stdout + mix.stderr)[-3000:]
    return DemoRun(demo.returncode, demo.stdout + demo.stderr, root, home, env, demo_run_model)
