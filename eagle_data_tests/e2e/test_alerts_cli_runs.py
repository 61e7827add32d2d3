"""A run launched from the CLI that fails is announced like one launched from the UI: the real daemon
(`dagster-daemon run`, as `dagster dev` starts it) against a fresh instance, the webhook receiver on 127.0.0.1,
and a failing `dagster asset materialize` run in another process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle_data.alerts import WEBHOOK_ENV
from eagle_data.standins.local import stop_process_group
from eagle_data.standins.webhook import Receiver
from eagle_data_tests.conftest import materialize_cli

REPO = Path(__file__).resolve().parents[2]
READY = "Initiating run_failure_alerts"  # the sensor's first tick: it alerts on runs that fail after it
WAIT_S = 240  # the daemon's start and first tick take ~20 s idle; the alert then comes within a 5-s tick


def wait_for(predicate, what: str, log: Path, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s; daemon log:\n{log.read_text()[-3000:]}"
        time.sleep(1)


@pytest.mark.timeout(900)
def test_a_failed_run_launched_from_the_cli_is_posted_to_the_webhook(tmp_path: Path):
    """Regression: `run_failure_alerts` matched only runs whose origin is its own code location, and a CLI run
    has none, so a failed CLI run never reached the webhook."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    with Receiver() as hook:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
        env.update(DAGSTER_HOME=str(home), EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(tmp_path / "out"))
        env[WEBHOOK_ENV] = hook.url  # the alert sensors run by default where a webhook is set
        log = tmp_path / "daemon.log"
        with log.open("w") as sink:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "dagster._daemon", "run", "-m", "eagle_data.definitions"],
                cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            wait_for(lambda: READY in log.read_text(), "first run_failure_alerts tick", log)
            config = {"ops": {"b7_sharegpt_prompts": {"config": {"source_path": str(tmp_path / "nowhere.jsonl")}}}}
            failed = materialize_cli(env, "--select", "b7_sharegpt_prompts", "--partition", "00000",
                                     run_config=config, timeout_s=300)  # fmt: skip
            assert failed.returncode != 0 and "nowhere.jsonl" in failed.stdout + failed.stderr
            wait_for(lambda: any("Run failed" in body["text"] for body in hook.bodies), "run alert", log)
        finally:
            stop_process_group(daemon)
    [posted] = [body for body in hook.bodies if "Run failed" in body["text"]]
    text = json.dumps(posted)
    assert "b7_sharegpt_prompts" in text and "[00000]" in text and "nowhere.jsonl" in text, text
