"""Every exception a step can raise is a user error or a bug. A user error (any `types.UserError`) is one line
in Dagster (the UI, the CLI's and the alerts' line): a `dg.Failure` with the message as its description, never
a DagsterExecutionStepExecutionError with a class path and a stack. A bug keeps its class and traceback."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from eagle_data.alerts import AlertError, readable
from eagle_data.catalog import load_catalog
from eagle_data.defs.drafter import build_drafter_assets
from eagle_data.defs.messages import user_failure
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter.trainers import TrainerError
from eagle_data.engines.sglang_fleet import ServerGoneError
from eagle_data.exports.parity import ParityError
from eagle_data.quality.registry import RegistryError
from eagle_data.runner.breaker import BreakerTripped
from eagle_data.runner.lease import LeaseLost
from eagle_data.runner.run import LeaseHeld, NothingAnswered
from eagle_data.sources import BadRow
from eagle_data.stages.preflight import PreflightError
from eagle_data.types import ConfigError, UserError

PACKAGE = Path(__file__).resolve().parents[2] / "eagle_data"
# The exceptions of eagle_data that are not user errors, each with why it never reaches a step as one.
BUGS = {
    BadRow: "caught in eagle_data.sources: the row is a counted skip with its reason, never raised to a step",
    ServerGoneError: "caught inside the SGLang engine: the server is marked down and the request retried",
    RegistryError: "raised when quality.registry is imported with a declaration it cannot honour: a bug in the code",
}
RAISED = [
    PreflightError("b7_sharegpt: before any request: cannot fetch tokenizer 'Qwen/Qwen3-8B'; set "
                   "EAGLE_DATA_TARGET_TOKENIZER"),
    LeaseHeld("b7_sharegpt: 1 shard(s) still held by another run after waiting lease_wait_s=3600 s"),
    NothingAnswered("b7_sharegpt: every request failed, no usable reply"),
    BreakerTripped("b7_sharegpt: breaker tripped: 40% of the last 200 replies empty"),
    LeaseLost("b7_sharegpt 00000: the shard lease could not be renewed for 45 s"),
    ConfigError("EAGLE_DATA_TIMEOUT_S='1m' is not a number: give e.g. EAGLE_DATA_TIMEOUT_S=120"),
    TrainerError("[drafter.capture] formats: eagle3-native: capture them separately"),
    ParityError("trainer_parity needs SpecForge's data modules (No module named 'specforge'); pip install it"),
    AlertError("alert webhook answered HTTP 404 (check $EAGLE_DATA_ALERT_WEBHOOK)"),
]  # fmt: skip


def exception_classes() -> set[type[BaseException]]:
    """Every exception class defined at the top of an eagle_data module (each module imported)."""
    found: set[type[BaseException]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = importlib.import_module(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        found |= {
            obj for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
        }  # fmt: skip
    return found


def test_every_exception_class_of_eagle_data_is_a_user_error_or_a_listed_bug() -> None:
    """On main, TrainerError (a setting the chosen trainers refuse), ParityError (the parity check cannot
    start) and AlertError (the webhook refused) were plain exceptions: a class path and a traceback."""
    classes = exception_classes()
    assert len(classes) > 20 and set(BUGS) <= classes  # the walk found them, and the list names real classes
    unsorted = sorted(c.__qualname__ for c in classes - set(BUGS) if not issubclass(c, UserError))
    assert not unsorted, f"derive these from types.UserError, or list them in BUGS with a reason: {unsorted}"
    assert not [c for c in BUGS if issubclass(c, UserError)]


def fail_in_a_real_step(body, instance: dg.DagsterInstance) -> tuple[dg.DagsterEvent, int]:
    """The step's failure, and how many times a retry policy of 2 retried it."""

    @dg.asset(retry_policy=dg.RetryPolicy(max_retries=2))
    def step() -> None:
        body()

    result = dg.materialize([step], instance=instance, raise_on_error=False)
    [failure] = result.get_step_failure_events()
    return failure, sum(e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY for e in result.all_events)


@pytest.fixture(scope="module")
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


@pytest.mark.parametrize("error", RAISED, ids=lambda e: type(e).__name__)
def test_a_user_error_in_a_real_step_is_its_one_line_without_class_path(
    error: UserError, instance: dg.DagsterInstance
) -> None:
    """#32.8: PreflightError, LeaseHeld, NothingAnswered, BreakerTripped and LeaseLost arrived as a
    DagsterExecutionStepExecutionError with the class path and a traceback."""

    @user_failure
    def body() -> None:
        raise error

    failure, retries = fail_in_a_real_step(body, instance)
    data = failure.step_failure_data
    assert retries == 0  # it names something to fix: retrying would only repeat it
    assert data.user_failure_data is not None and data.user_failure_data.description == str(error)
    assert data.error is not None and data.error.cls_name == "Failure" and data.error.cause is None
    assert readable(data.error.message) == str(error)  # the alerts' and the CLI's line
    assert data.user_failure_data.metadata["error"].value == type(error).__name__


def test_a_user_error_in_an_asset_checks_generator_is_one_line_too(instance: dg.DagsterInstance) -> None:
    @dg.asset
    def produced() -> None:
        return None

    @dg.multi_asset_check(specs=[dg.AssetCheckSpec("judged", asset=produced)])
    @user_failure
    def judged() -> Iterator[dg.AssetCheckResult]:
        yield from ()
        raise LeaseLost("b7_sharegpt 00000: the shard lease could not be renewed for 45 s")

    result = dg.materialize([produced, judged], instance=instance, raise_on_error=False)
    [failure] = result.get_step_failure_events()
    assert failure.step_failure_data.user_failure_data.description.startswith("b7_sharegpt 00000: the shard lease")


def test_a_bug_keeps_its_class_and_its_traceback(instance: dg.DagsterInstance) -> None:
    @user_failure
    def body() -> None:
        raise KeyError("num_turns")

    failure, retries = fail_in_a_real_step(body, instance)
    data = failure.step_failure_data
    assert data.user_failure_data is None and retries == 2  # a bug may be a passing fault: the policy applies
    error = data.error.cause or data.error
    assert error.cls_name == "KeyError" and error.stack


def test_draft_vocab_before_the_mix_fails_in_one_line(tmp_path: Path) -> None:
    specs = list(load_catalog(profile="demo").values())
    asset = next(a for a in build_drafter_assets(specs) if a.key.to_user_string() == "draft_vocab")
    result = dg.materialize([asset], resources={"storage": StorageResource(root=str(tmp_path))}, raise_on_error=False)
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error
    assert error is not None and error.cls_name == "Failure", error.cls_name
    assert error.message.strip().endswith("does not exist: materialize training_mix first")
    assert "\n" not in error.message.strip()
