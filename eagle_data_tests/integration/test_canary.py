"""The canary: a sample drawn across the dataset, judged by the validation gates in `{ds}_estimate`, stops
a run against a broken server after the sample, and keeps later runs under the same config from starting.

Runs are real Dagster runs on one instance against the fake OpenAI server (the demo profile's sample, 40 rows
of which 36 are prompts, over 4 partitions of 10, thinking off, on a Qwen-vocabulary target); the server counts
every request it was billed for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from eagle_data import quality
from eagle_data.catalog import Checks, DatasetSpec, load_catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.estimate import CANARY
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import ENGINE_ENV, POOL_ENV, EngineResource, StorageResource
from eagle_data.quality.canary import draw, judge, rank
from eagle_data.runner.resultlog import ResultLog
from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data.storage import ShardStore
from eagle_data_tests.fixtures_quality import set_rows, validated_frame, varied_replies

SAMPLE = 16  # canary prompts drawn of the demo's 36
EMPTY_RETRIES = 1  # the runner's default: an empty reply is asked again this many times, then the row fails
RANGE = {"dagster/asset_partition_range_start": "00000", "dagster/asset_partition_range_end": "00003"}
SHAPE = {"max_prompts": 40, "target": "qwen3-test"}  # the whole sample; the fake's replies are tokenized as Qwen's


# ---- the draw and the refusal, pure ----------------------------------------------------------------------
def _prompts(n: int) -> pl.DataFrame:
    return pl.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "source_row": list(range(n))})


def test_the_draw_takes_the_smallest_hashes_over_every_block_and_groups_them_by_partition():
    prompts = _prompts(1000)
    whole = draw([prompts], 20, shard_size=100)
    split = draw([prompts.slice(i, 70) for i in range(0, 1000, 70)], 20, shard_size=100)
    assert whole.keys() == split.keys() and all(whole[k].equals(split[k]) for k in whole)
    ranked = prompts.with_columns(r=pl.Series([rank(0, p) for p in prompts["prompt_id"]]))
    expected = set(ranked.bottom_k(20, by="r")["prompt_id"])
    assert {p for frame in whole.values() for p in frame["prompt_id"]} == expected
    assert len(whole) > 3  # spread over the dataset, not shard 0
    for key, frame in whole.items():  # a row's partition is its position over the shard size
        assert (frame["source_row"] // 100 == int(key)).all() and (frame["shard"] == int(key)).all()
    reseeded = draw([prompts], 20, shard_size=100, seed=1)
    assert {p for f in reseeded.values() for p in f["prompt_id"]} != expected  # the seed picks another sample


@pytest.mark.parametrize(
    ("latest", "ignore", "blocked"),
    [
        (None, False, False),  # never canaried
        (quality.LatestCanary(True, "h1", "passed"), False, False),
        (quality.LatestCanary(False, "h1", "canary failed on lost_text"), False, True),
        (quality.LatestCanary(False, "h1", "canary failed on lost_text"), True, False),  # overridden
        (quality.LatestCanary(False, "h0", "canary failed on truncation_rate"), False, False),  # another config
    ],
)
def test_a_failed_canary_blocks_only_runs_under_the_same_config_unless_overridden(
    latest: quality.LatestCanary | None, ignore: bool, blocked: bool
):
    why = quality.canary_blocks(latest, "h1", ignore=ignore, dataset="b7_sharegpt")
    assert bool(why) is blocked
    if blocked:
        assert "\n" not in why and "lost_text" in why and "ignore_canary" in why


def _judge(frame: pl.DataFrame) -> quality.Canary:
    rows = quality.row_verdicts(frame, Checks(), thinking=True)
    return judge(rows, Checks(), True, dataset="fx", max_tokens=4096, suggested_max_tokens=256, config_hash="h")


def test_a_failing_canary_names_the_verdict_its_gate_counts_not_another_rejection():
    frame = set_rows(validated_frame(varied_replies(64)), [0, 1, 2, 3, 4], special_in_text=1)  # not gated
    canary = _judge(set_rows(frame, [10, 11, 12, 13], content="", reasoning="", loss_tokens=3))
    shares = canary.shares
    assert canary.failing == ("empty_response",) and shares["special_token_in_text"] > shares["empty_completion"]
    assert "6.2% of them are empty_completion (e.g. fixture-00010, fixture-00011, fixture-00012)" in canary.line
    assert canary.examples == ("fixture-00010", "fixture-00011", "fixture-00012") and "\n" not in canary.line


def test_rows_that_pass_alone_but_fail_together_are_named_by_the_gate():
    frame = validated_frame(varied_replies(64))
    canary = _judge(set_rows(frame, list(range(20, 36)), content=frame["content"][20]))  # one completion, 16 prompts
    assert canary.failing == ("empty_response",) and canary.shares["pass"] == 1.0
    assert "25.0% of prompts got the same completion" in canary.line


def test_a_gate_crossed_by_a_stray_reply_or_two_is_not_sure_on_a_sample_and_passes():
    """1 or 2 empty replies in 64 (1.6%, 3.1%) are over the 1% gate, yet say nothing about the server; 4 are
    (the one-sided bound at the catalog's checks.confidence, which the gates judge every share by), as are 4
    prompts sharing a completion only in a larger share."""
    frame = validated_frame(varied_replies(64))
    for rows in ([10], [10, 11]):
        assert _judge(set_rows(frame, rows, content="", reasoning="", loss_tokens=3)).passed
    assert not _judge(set_rows(frame, [10, 11, 12, 13], content="", reasoning="", loss_tokens=3)).passed
    assert _judge(set_rows(frame, [20, 21, 22, 23], content=frame["content"][20])).passed


# ---- through Dagster, against the fake server ------------------------------------------------------------
@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv(ENGINE_ENV, "openai")  # the generation asset's pool is the environment's engine
    monkeypatch.delenv(POOL_ENV, raising=False)
    server = FakeOpenAI(Faults(reply_tokens=(20, 90)))
    server.start()
    monkeypatch.setenv("EAGLE_DATA_BASE_URL", f"http://127.0.0.1:{server.port}/v1")
    with dg.DagsterInstance.ephemeral() as instance:
        yield {"server": server, "instance": instance, "root": str(tmp_path / "out")}
    server.stop()


def _spec(max_tokens: int = 96) -> DatasetSpec:
    spec = load_catalog(profile="demo")["b7_sharegpt"].model_copy(
        update={"token_budget": 0, "cost_budget_usd": 0.0, **SHAPE}
    )
    return spec.model_copy(update={"generation": spec.generation.model_copy(update={"max_tokens": max_tokens})})


def _run(setup: dict[str, Any], spec: DatasetSpec, steps: tuple[str, ...], **config: Any) -> dg.ExecuteInProcessResult:
    """One run of the named steps over every partition (prompts, estimate, generation)."""
    assets = dict(zip(("prompts", "estimate", "generation"), build_dataset_assets(spec)[:3], strict=True))
    ops = {"estimate": f"{spec.name}_estimate", "generation": spec.name}
    run_config = {"ops": {ops[step]: {"config": config[step]} for step in config}}
    engine = EngineResource(kind="openai", model="m", api_key_env="")
    return dg.materialize(
        list(assets.values()), selection=[assets[step].key for step in steps], instance=setup["instance"],
        tags=RANGE, run_config=run_config,
        resources={**shard_resources(StorageResource(root=setup["root"])), "engine": engine}, raise_on_error=False,
    )  # fmt: skip


def _prompts_in(store: ShardStore, spec: DatasetSpec) -> int:
    return sum(store.read_shard(spec.name, f"{spec.name}_prompts", k).height for k in spec.partition_keys)


def _canary(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == CANARY]
    return evaluation


def _estimate(setup: dict[str, Any], spec: DatasetSpec, sample: int = SAMPLE) -> dg.ExecuteInProcessResult:
    return _run(setup, spec, ("prompts", "estimate", "generation"), estimate={"canary_prompts": sample})


@pytest.mark.parametrize(
    ("faults", "verdict"),
    [
        ({"fixed_text": ""}, "failed: empty_reply"),  # every reply empty: failed attempts, retried
        (
            {"fixed_text": "x", "reported_tokens": 20},
            "failed: lost_text",
        ),  # 1 char for 20 reported tokens: billed, not kept
        ({"fixed_text": "OK."}, "short_loss"),  # the DFlash run: every reply "OK."
    ],
)
def test_a_broken_server_is_stopped_by_the_canary_after_the_sample(
    setup: dict[str, Any], faults: dict[str, Any], verdict: str
):
    server, spec = setup["server"], _spec()
    server.faults = Faults(**faults)
    result = _estimate(setup, spec)
    assert not result.success
    canary = _canary(result)
    assert not canary.passed and "\n" not in (canary.description or "")
    assert f"are {verdict} (e.g. " in (canary.description or "")
    assert canary.metadata["canary_sample"].value == SAMPLE
    assert len({turn.split("#")[0] for turn in server.requests}) == SAMPLE  # only the sample was asked ...
    assert server.received <= SAMPLE * (1 + EMPTY_RETRIES)  # ... and paid for at most once more when empty
    # A blocking check, as the UI labels it: the estimate's step fails on it and Dagster skips generation.
    [failure] = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error.message
    assert failure.step_key == f"{spec.name}_estimate" and "blocking asset check" in error, error
    assert spec.name not in {e.step_key for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START}
    summary = result.asset_materializations_for_node(f"{spec.name}_estimate")[0].metadata["summary"].value
    assert "**Canary: FAILED.**" in summary and "may start" not in summary  # never both
    assert "**Generation will not start:** the blocking check" in summary and "canary" in summary.split("start:")[1]
    assert not any(ShardStore(setup["root"]).shard_exists(spec.name, spec.name, k) for k in spec.partition_keys)


def test_a_later_run_under_the_same_config_refuses_in_one_line_unless_told_to_ignore_the_canary(setup: dict[str, Any]):
    server, spec = setup["server"], _spec()
    server.faults = Faults(fixed_text="OK.")
    assert not _estimate(setup, spec).success
    paid = server.received
    refused = _run(setup, spec, ("generation",))  # e.g. from the CLI or a schedule, without the estimate
    assert not refused.success and server.received == paid  # not one request
    [failure] = [e for e in refused.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message.strip()
    assert "\n" not in message and "refused before any request" in message and "ignore_canary" in message
    assert _run(setup, spec, ("generation",), generation={"ignore_canary": True}).success
    assert server.received > paid


def test_an_estimate_that_failed_before_judging_its_canary_does_not_break_later_runs(setup: dict[str, Any]):
    """#34.4: a 401 in the estimate left the canary PLANNED, and every later generation run died on
    `'AssetCheckEvaluationPlanned' object has no attribute 'metadata'`."""
    server, spec = setup["server"], _spec()
    server.faults = Faults(force_status=401)
    assert not _run(setup, spec, ("prompts", "estimate"), estimate={"canary_prompts": SAMPLE}).success
    server.faults = Faults(reply_tokens=(20, 90))  # the key fixed
    later = _run(setup, spec, ("generation",))
    failures = [e.step_failure_data.error.message for e in later.all_events if e.is_step_failure]
    assert later.success, failures


def test_a_changed_generation_config_judges_the_canary_again_before_paying(setup: dict[str, Any]):
    """#34.8: after a passing canary, temperature 0.71 skipped it and billed 100 replies until the breaker."""
    server, spec = setup["server"], _spec()
    assert _estimate(setup, spec).success  # judged and passed under this config; the server then breaks
    server.faults = Faults(fixed_text="OK.")
    paid = server.received
    changed = spec.model_copy(update={"generation": spec.generation.model_copy(update={"temperature": 0.71})})
    refused = _run(setup, changed, ("generation",))
    assert not refused.success
    [failure] = [e for e in refused.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message.strip()
    assert "\n" not in message and f"{spec.name}: refused before the run: canary failed" in message
    assert "materialize b7_sharegpt_estimate again" in message
    assert server.received - paid <= SAMPLE * (1 + EMPTY_RETRIES)  # only the sample, under the new config


def test_a_truncating_sample_names_the_max_tokens_to_set_and_a_raised_cap_reruns_only_the_cut_replies(
    setup: dict[str, Any],
):
    # every prompt in the canary: a share is judged by its lower bound; ~17% is sure over 5% only on ~40 replies
    server, spec = setup["server"], _spec(max_tokens=170)
    server.faults = Faults(reply_tokens=(20, 200))  # 30 of the 181 natural lengths exceed 170: ~17% cut
    failed = _estimate(setup, spec, sample=40)
    canary = _canary(failed)
    assert not failed.success and not canary.passed and canary.metadata["failing"].value == "truncation_rate"
    suggested = canary.metadata["canary_suggested_max_tokens"].value
    assert suggested >= 200 and f"max_tokens={suggested} would cover 95%" in (canary.description or "")
    store = ShardStore(setup["root"])
    logs = pl.concat([ResultLog(store, spec.name, k).load() for k in spec.partition_keys])
    cut = set(logs.filter(pl.col("status") == "truncated")["prompt_id"])
    assert 0 < len(cut) < 40
    asked = dict(server.requests)
    raised = _spec(max_tokens=suggested)
    assert _run(setup, raised, ("generation",)).success  # another config: the refusal does not hold
    rows = pl.concat([store.read_shard(spec.name, spec.name, k) for k in spec.partition_keys])
    assert rows.height == _prompts_in(store, spec) and set(rows["status"]) == {"ok"}
    again = {turn for turn, n in asked.items() if server.requests[turn] > n}
    assert {turn.split("#")[0] for turn in again} == cut  # only the cut replies were paid for again
    assert all(server.requests[turn] == asked[turn] + 1 for turn in again)


def test_a_passing_canary_lets_the_run_go_on_and_the_full_run_reuses_every_sampled_reply(setup: dict[str, Any]):
    server, spec = setup["server"], _spec()
    result = _estimate(setup, spec)
    assert result.success, _canary(result).description
    canary = _canary(result)
    assert canary.passed and canary.metadata["config_hash"].value
    figures = result.asset_materializations_for_node(f"{spec.name}_estimate")[0].metadata
    shares = {k: v.value for k, v in figures.items() if k.startswith("canary_share_")}
    assert figures["canary_sample"].value == SAMPLE and shares["canary_share_pass"] > 0.9
    assert sum(shares.values()) == pytest.approx(1.0)  # one verdict per sampled row
    assert "canary_suggested_max_tokens" in figures and figures["canary_truncated_share"].value == 0.0
    assert set(server.requests.values()) == {1}  # no sampled turn was asked twice
    store = ShardStore(setup["root"])
    written = sum(store.read_shard(spec.name, spec.name, k).height for k in spec.partition_keys)
    assert written == _prompts_in(store, spec)
