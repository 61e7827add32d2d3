"""`eagle-data demo` prints a short progress and summary (under 40 lines); Dagster's full log goes to a file."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from eagle_data.catalog import load_catalog
from eagle_data.cli import DEMO_DATASET, MAX_NOTES, RunView, demo_command, report_line, run_quietly, summary
from eagle_data.storage import ShardStore

README = Path(__file__).resolve().parents[2] / "README.md"
RUN = "df816632-a426-4a7e-ad44-35d5ebff0108"
HEADER_LINES = 4  # what `demo` prints before the run starts
BUDGET = 40


def line(level: str, rest: str) -> str:
    """A line in the shape Dagster's CLI prints (copied from a real `make demo` run)."""
    return f"2026-11-30 08:02:56 +0000 - dagster - {level} - __ASSET_JOB - {RUN} - {rest}"


def busy_run() -> list[str]:
    """A long run's log: four steps, hundreds of progress lines, heartbeats, six checks with one failure."""
    lines = []
    for step in ("b7_sharegpt_prompts", "b7_sharegpt", "b7_sharegpt_validated", "b7_sharegpt_quality_checks"):
        lines += [line("DEBUG", f"25768 - {step} - STEP_WORKER_STARTING - Launching subprocess for \"{step}\"."),
                  line("DEBUG", f"25768 - {step} - STEP_START - Started execution of step \"{step}\".")]  # fmt: skip
        lines += [line("INFO", f"{step} - {step}: heartbeat: 4 in flight, oldest 30 s, {i}/900 done")
                  for i in range(300)]  # fmt: skip
        lines += [line("INFO", f"{step} - b7_sharegpt {i:05d}: 10 ok, 0 truncated, 0 failed") for i in range(90)]
        lines.append(line("DEBUG", f'25768 - {step} - STEP_SUCCESS - Finished execution of step "{step}" in 1.2s.'))
    for name in ("empty_response", "token_structure", "truncation_rate", "failed_rate", "reasoning_present"):
        lines.append(
            line(
                "DEBUG",
                f"32391 - b7_sharegpt_quality_checks - ASSET_CHECK_EVALUATION - Asset check "
                f"'{name}' on 'b7_sharegpt_validated' passed. Description: 'all 4 shards pass'",
            )
        )
    lines.append(
        line(
            "DEBUG",
            "32391 - b7_sharegpt_quality_checks - ASSET_CHECK_EVALUATION - Asset check "
            "'length_shift' on 'b7_sharegpt_validated' did not pass. Description: 'shard 00001: +80%'",
        )
    )
    return [*lines, line("DEBUG", '25370 - RUN_SUCCESS - Finished execution of run for "__ASSET_JOB".')]


def test_a_long_run_stays_within_the_line_budget(tmp_path: Path):
    import dagster._core.events as events  # the failed check's words in busy_run are Dagster's own:

    assert '"did not pass."' in Path(events.__file__).read_text()  # the summary once missed every failed check
    view = RunView()
    notes = [n for i, raw in enumerate(busy_run()) if (n := view.note(raw, now=i * 0.01))]
    assert len(notes) == MAX_NOTES + 1 and notes[-1] == "  ... (the rest is in the log)"
    assert notes[:3] == [
        "  b7_sharegpt_prompts: started",
        "  b7_sharegpt_prompts: heartbeat: 4 in flight, oldest 30 s, 0/900 done",
        "  b7_sharegpt_prompts: b7_sharegpt 00000: 10 ok, 0 truncated, 0 failed",
    ]
    assert sum("heartbeat" in n for n in notes) == 1  # one per minute at most
    closing = summary(view, 0, 738, tmp_path / "demo.log", ["output: …", "quality report: …", "browse it all: …"])
    assert closing[1] == "[eagle-data] checks: 5 passed; warned (not blocking): length_shift"  # a WARN check
    assert closing[-1] == f"[eagle-data] full Dagster log: {tmp_path / 'demo.log'}"
    assert HEADER_LINES + len(notes) + len(closing) < BUDGET


def test_a_finished_step_is_shown_with_its_time():
    raw = line("DEBUG", '6842 - b7_sharegpt_prompts - STEP_SUCCESS - Finished execution of step "b7_sharegpt_prompts" '
                        "in 193ms.")  # fmt: skip
    assert RunView().note(raw, 0.0) == "  b7_sharegpt_prompts: done in 193ms"


def test_a_step_failure_and_a_failed_check_are_shown_even_after_the_budget_is_spent():
    view = RunView()
    view.notes = MAX_NOTES + 1
    assert view.note(line("DEBUG", "1 - b7_sharegpt - STEP_FAILURE - Execution of step failed."), 0.0) is None
    assert view.failed_steps == ["b7_sharegpt"]  # still in the summary


def test_a_step_whose_own_failure_event_was_lost_is_shown_from_the_runs_failure():
    """On a loaded machine the step process's STEP_FAILURE never reached the CLI's output (its parent exited
    first): only RUN_FAILURE, with the error below it, as recorded in such a run's log."""
    view = RunView()
    raw = [
        line("DEBUG", '2 - b7_sharegpt_prompts - STEP_START - Started execution of step "b7_sharegpt_prompts".'),
        line("ERROR", "1 - RUN_FAILURE - Execution of run for \"__ASSET_JOB\" failed. Steps failed: "
                      "['b7_sharegpt_prompts']."),
        "",
        "dagster._core.definitions.events.Failure: dataset 'b7_sharegpt': source file /x/nowhere.jsonl not found",
        "",
        "Stack Trace:",
    ]  # fmt: skip
    notes = [n for raw_line in raw if (n := view.note(raw_line, 0.0))]
    assert notes == [
        "  b7_sharegpt_prompts: started",
        "  b7_sharegpt_prompts: FAILED: dataset 'b7_sharegpt': source file /x/nowhere.jsonl not found",
    ]
    assert view.failed_steps == ["b7_sharegpt_prompts"]
    seen = RunView()  # where the step's own event arrived, the run's failure adds nothing
    step_failure = line("DEBUG", "2 - b7_sharegpt_prompts - STEP_FAILURE - Execution of step failed.")
    notes = [n for raw_line in [step_failure, raw[3], *raw[1:]] if (n := seen.note(raw_line, 0.0))]
    assert [n for n in notes if "FAILED" in n] == [notes[0]] and seen.failed_steps == ["b7_sharegpt_prompts"]


@pytest.fixture
def demo_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    (tmp_path / "home").mkdir()
    env.update(EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(tmp_path / "out"), DAGSTER_HOME=str(tmp_path / "home"))
    return env


def test_a_run_that_fails_before_any_step_shows_its_cause(demo_env: dict[str, str], tmp_path: Path):
    cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_data.definitions",
           "--select", "no_such_asset", "--partition", "00000"]  # fmt: skip
    code, view = run_quietly(cmd, demo_env, tmp_path / "demo.log", lambda text: None)
    closing = summary(view, code, 3, tmp_path / "demo.log", [])
    assert code != 0 and closing[0].startswith("[eagle-data] FAILED (exit ")
    assert any("no_such_asset" in c for c in closing[1:-1]), closing
    assert len(closing) <= 7


def test_a_user_error_in_a_step_is_printed_as_its_one_line(demo_env: dict[str, str], tmp_path: Path):
    """The CLI printed 'FAILED: Execution of step "b7_sharegpt_prompts" failed.' and never why."""
    config = {"ops": {"b7_sharegpt_prompts": {"config": {"source_path": str(tmp_path / "nowhere.jsonl")}}}}
    cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_data.definitions",
           "--select", "b7_sharegpt_prompts", "--partition", "00000", "--config-json", json.dumps(config)]  # fmt: skip
    printed: list[str] = []
    code, view = run_quietly(cmd, demo_env, tmp_path / "demo.log", printed.append)
    [failed] = [p for p in printed if "FAILED" in p]
    assert code != 0 and view.failed_steps == ["b7_sharegpt_prompts"]
    assert failed.startswith("  b7_sharegpt_prompts: FAILED: ") and "nowhere.jsonl" in failed, printed
    assert "dagster._core" not in failed and "Error:" not in failed and "Execution of step" not in failed


def test_the_demo_materializes_its_datasets_whole_group():
    """Regression: the demo left `{ds}_estimate` unmaterialized, grey and "0% filled" on the group's page."""
    import dagster as dg

    from eagle_data.definitions import build_definitions

    spec = load_catalog(profile="demo")[DEMO_DATASET]
    cmd = demo_command(spec)
    selected = cmd[cmd.index("--select") + 1].split(",")
    graph = build_definitions([spec]).resolve_asset_graph()
    group = {key.to_user_string() for key in dg.AssetSelection.groups(DEMO_DATASET).resolve(graph)}
    assert sorted(selected) == sorted(group) and len(group) == 4
    assert cmd[cmd.index("--partition-range") + 1] == f"{spec.partition_keys[0]}...{spec.partition_keys[-1]}"


def test_the_summary_opens_the_report_and_names_readme_sections_that_exist(tmp_path: Path, monkeypatch):
    """Regression: the summary sent readers to README's "Running real jobs", a section that does not exist, and
    its report link was a file:// path that the UI's page cannot open."""

    monkeypatch.delenv("EAGLE_DATA_FILES_URL", raising=False)
    line = report_line(ShardStore(str(tmp_path)), "b7_sharegpt/b7_sharegpt_quality/index.html")
    assert line == (f"quality report: file://{tmp_path}/b7_sharegpt/b7_sharegpt_quality/index.html (from the UI: "
                    "`python -m eagle_data.files_server`, then "
                    "http://127.0.0.1:3001/b7_sharegpt/b7_sharegpt_quality/index.html)")  # fmt: skip
    import inspect

    import eagle_data.cli as cli

    named = re.findall(r'README\.md, \\?"([^"\\]+)\\?"', inspect.getsource(cli))
    headings = re.findall(r"^## (.+)$", README.read_text(), flags=re.MULTILINE)
    assert named and all(section in headings for section in named), (named, headings)
