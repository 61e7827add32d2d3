"""A hidden-state capture step dies with its run, as generation steps do: a step whose run worker is gone
(the CLI was SIGKILLed while the step process started) stops before capturing anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from eagle_data.catalog import load_catalog
from eagle_data.defs.drafter import CaptureResource, build_drafter_assets, follow_the_mix
from eagle_data.defs.pools import WORKER_TAG
from eagle_data.defs.resources import StorageResource
from eagle_data.procs import worker_id
from eagle_data.storage import ShardStore
from eagle_data_tests.integration.test_drafter_capture import mix_frame, write_mix


def test_a_capture_whose_run_worker_is_gone_stops_before_capturing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#34.5: after a SIGKILL of the CLI the capture step went on to the last batch (files written 20 s after
    the kill), racing the re-run."""
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    monkeypatch.delenv("EAGLE_DATA_CAPTURE_CHECKPOINT", raising=False)
    specs = list(load_catalog(profile="demo").values())
    write_mix(tmp_path, mix_frame(specs[0].name, rows=6))
    asset = next(a for a in build_drafter_assets(specs) if a.key.to_user_string() == "hidden_states")
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)  # fmt: skip
    resources = {"storage": StorageResource(root=str(tmp_path)), "capture": CaptureResource(device="cpu")}
    tags = {WORKER_TAG: worker_id(dead)}  # what the run's executor records; that process no longer exists
    instance = dg.DagsterInstance.ephemeral()
    assert follow_the_mix(instance, 6) == ["00000"]  # the capture partitions training_mix sets
    result = dg.materialize([asset], resources=resources, instance=instance, partition_key="00000", tags=tags,
                            raise_on_error=False)  # fmt: skip
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "is gone (the run was killed): this step stops" in failure.step_failure_data.error.message
    captured = [k for k in ShardStore(str(tmp_path)).list("") if "hidden_states" in k]
    assert not captured, captured
