"""One shared demo run per test session: `eagle-data demo` as a newcomer runs it (every shard of b7_sharegpt's
prompts, estimate, generation and validated, a process per step, the repository's dagster.yaml), then
`training_mix`, once. Every test that only reads what a demo run leaves (its shards, its export, its summary, its
instance) reads this run instead of running the demo again.

It runs on a user catalog ($EAGLE_DATA_CATALOG, as a team keeps its own settings) that trims the dataset to half
the demo's prompts and canary, still over two shards: its real model is the suite's largest cost, and the same
stages and gates run on 10 prompts as on 20 (the whole demo took 271 of the suite's 1,170 CPU-seconds on 2 cores,
the trimmed one 138 alone). `DemoRun.spec` is the dataset as the run saw it.

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

from eagle_data.catalog import USER_CATALOG_ENV, DatasetSpec, load_catalog

DEMO_RUN_MODEL_ENV = "EAGLE_TEST_DEMO_RUN_MODEL"
DEMO_DATASET = "b7_sharegpt"
TRIMMED = {"max_prompts": 10, "shard_size": 5, "canary_prompts": 4}  # the demo profile's: 20, 10 and 8
# The run's bound: it took 139 s alone on an idle 2-core machine at one thread, and 339 s beside 8 busy loops and
# the suite's 7 other workers (untrimmed and at the others' priority, 22 minutes); the tests that read it carry
# the same bound (test_definitions.py).
DEMO_RUN_TIMEOUT_S = 3600
# The run is one chain (canary, generation, validation; a reply one token at a time) while the other workers run
# many short files beside it: it ends last unless it goes ahead of them. Its process and every step it starts take
# a higher priority where the system lets them (as root); elsewhere they run as they are.
AHEAD = "import contextlib, os\nwith contextlib.suppress(PermissionError):\n    os.nice(-10)\n"


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

    @property
    def spec(self) -> DatasetSpec:
        """The demo dataset as the run read it: the demo profile under the run's user catalog."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(USER_CATALOG_ENV, self.env[USER_CATALOG_ENV])
            return load_catalog(profile="demo")[DEMO_DATASET]


@pytest.fixture(scope="session")
def demo_run_model(request: pytest.FixtureRequest) -> Path:
    """The model the shared demo run generates with: the one setting to change it."""
    chosen = os.environ.get(DEMO_RUN_MODEL_ENV)
    return Path(chosen) if chosen else request.getfixturevalue("smollm2")


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory, demo_run_model: Path) -> DemoRun:
    from eagle_data_tests.conftest import materialize_cli

    base = tmp_path_factory.mktemp("demo-run")
    home, root, trim = base / "home", base / "out", base / "catalog.toml"
    trim.write_text(f"[datasets.{DEMO_DATASET}]\n" + "".join(f"{key} = {value}\n" for key, value in TRIMMED.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(home), EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(root),
               EAGLE_DATA_DEMO_MODEL=str(demo_run_model), **{USER_CATALOG_ENV: str(trim)})  # fmt: skip
    code = AHEAD + "from eagle_data.cli import main; raise SystemExit(main(['demo']))"
    demo = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=DEMO_RUN_TIMEOUT_S, cwd=base)  # fmt: skip
    if demo.returncode == 0:
        mix = materialize_cli(env, "--select", "training_mix", timeout_s=600)
        assert mix.returncode == 0, (mix.stdout + mix.stderr)[-3000:]
    return DemoRun(demo.returncode, demo.stdout + demo.stderr, root, home, env, demo_run_model)
