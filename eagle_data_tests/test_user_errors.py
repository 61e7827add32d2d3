"""Every exception a step raises on user input is one line in Dagster (the CLI, the UI, the alerts): a
`dg.Failure` with the message, never a DagsterExecutionStepExecutionError with a class path and a stack."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from eagle_data.catalog import load_catalog
from eagle_data.defs.drafter import build_drafter_assets
from eagle_data.defs.messages import user_failure
from eagle_data.defs.resources import StorageResource
from eagle_data.runner.breaker import BreakerTripped
from eagle_data.runner.lease import LeaseLost
from eagle_data.runner.run import LeaseHeld, NothingAnswered
from eagle_data.stages.preflight import PreflightError

RAISED = [
    PreflightError("b7_sharegpt: before any request: cannot fetch tokenizer 'Qwen/Qwen3-8B'; set "
                   "EAGLE_DATA_TARGET_TOKENIZER"),
    LeaseHeld("b7_sharegpt: 1 shard(s) still held by another run after waiting lease_wait_s=3600 s"),
    NothingAnswered("b7_sharegpt: every request failed, no usable reply"),
    BreakerTripped("b7_sharegpt: breaker tripped: 40% of the last 200 replies empty"),
    LeaseLost("b7_sharegpt 00000: the shard lease could not be renewed for 45 s"),
]  # fmt: skip


@pytest.mark.parametrize("error", RAISED, ids=lambda e: type(e).__name__)
def test_each_user_error_of_a_step_becomes_one_line(error: Exception) -> None:
    """#34.7: these arrived wrapped in DagsterExecutionStepExecutionError with a traceback."""

    @user_failure
    def step() -> None:
        raise error

    with pytest.raises(dg.Failure) as failed:
        step()
    assert failed.value.description == str(error)


def test_draft_vocab_before_the_mix_fails_in_one_line(tmp_path: Path) -> None:
    specs = list(load_catalog(profile="demo").values())
    asset = next(a for a in build_drafter_assets(specs) if a.key.to_user_string() == "draft_vocab")
    result = dg.materialize([asset], resources={"storage": StorageResource(root=str(tmp_path))}, raise_on_error=False)
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error
    assert error is not None and error.cls_name == "Failure", error.cls_name
    assert error.message.strip().endswith("does not exist: materialize training_mix first")
    assert "\n" not in error.message.strip()
