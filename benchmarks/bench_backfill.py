"""A dataset's group backfill as the UI launches it, against the CLI range run of the same assets, on the
demo profile; and how long a failed check takes to reach the alert webhook.

1. `dagster dev` (webserver, daemon, code server) on 127.0.0.1 with the repository's dagster.yaml
   in a fresh DAGSTER_HOME. Once the backfill daemon reports healthy, the GraphQL mutation the
   "Materialize all" dialog sends (`launchPartitionBackfill`: the group's assets, every partition) starts
   the clock, which stops when the backfill's run succeeds. The backfill must be exactly one run.
2. While the same `dagster dev` runs: a run of another dataset's prompts and estimate whose token budget is
   1 (a user catalog in $EAGLE_DATA_CATALOG), so `within_budget` fails; the delay is from that check's
   evaluation to the `quality_alerts` sensor's POST reaching a webhook receiver on 127.0.0.1.
3. `dagster dev` stopped, `dagster asset materialize --select <the group's assets> --partition-range` into
   a fresh output root, timed from start to exit.

    python benchmarks/bench_backfill.py [--dataset b7_sharegpt] [--alert-dataset b3_magicoder]
Last line: `RESULT backfill_s <x> cli_s <y> overhead_s <x-y> pickup_s <p> alert_s <z> load <1-min load averages,
start-end>`, pickup_s the wait for the backfill daemon's next iteration: the launch comes right after the
daemon's first iteration, so it is near that 30-s loop's worst case, where a person's launch waits 15 s on
average. What bounds the overhead: docs/running.md ("How long a UI backfill takes").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOCATION = "eagle_data.definitions"  # `dagster dev -m eagle_data.definitions` names the location after the module
REPOSITORY = "__repository__"
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}

LAUNCH_BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""
LAUNCH_RUN = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
GROUP = """
query($group: AssetGroupSelector!) {
  assetNodes(group: $group) { assetKey { path } partitionKeys }
}"""
RUNS = """
query($filter: RunsFilter!) {
  runsOrError(filter: $filter) {
    ... on Runs { results { runId status creationTime startTime endTime tags { key value } } }
  }
}"""
CHECK_EXECUTIONS = """
query($asset: AssetKeyInput!, $check: String!) {
  assetCheckExecutions(assetKey: $asset, checkName: $check, limit: 1) {
    status evaluation { timestamp success }
  }
}"""
DAEMONS = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy } } } }"


class Graphql:
    def __init__(self, url: str) -> None:
        self.url = f"{url}/graphql"

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.load(response)
        if answer.get("errors"):
            raise RuntimeError(f"GraphQL error: {answer['errors'][0]['message']}")
        return answer["data"]


def wait_until(what: str, predicate: Any, timeout_s: float, poll_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if value := predicate():
                return value
        time.sleep(poll_s)
    raise SystemExit(f"bench_backfill: {what} did not happen within {timeout_s:.0f} s")


@contextlib.contextmanager
def dagster_dev(env: dict[str, str], log: Path) -> Iterator[Graphql]:
    """`dagster dev` on a free port; stopped (SIGINT, then SIGKILL of its process group) on the way out."""
    from eagle_data.standins.local import free_port, stop_process_group

    port = free_port()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port), "-m", LOCATION],
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"bench_backfill: dagster dev exited with {proc.returncode}; see {log}")
            with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                return True

        wait_until("dagster dev answering", answers, 300, poll_s=1)
        yield Graphql(url)
    finally:
        stop_process_group(proc, grace_s=20)


def runs_tagged(graphql: Graphql, key: str, value: str) -> list[dict[str, Any]]:
    data = graphql(RUNS, filter={"tags": [{"key": key, "value": value}]})
    return data["runsOrError"]["results"]


def finished_run(graphql: Graphql, key: str, value: str, timeout_s: float) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        runs = runs_tagged(graphql, key, value)
        return runs[0] if runs and all(r["status"] in FINISHED for r in runs) else None

    return wait_until(f"the run tagged {key}={value} finishing", done, timeout_s)


def group(graphql: Graphql, dataset: str) -> tuple[list[str], list[str]]:
    """The assets of a dataset's group, as "Materialize all" takes them, and their partitions."""
    selector = {"groupName": dataset, "repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}
    nodes = graphql(GROUP, group=selector)["assetNodes"]
    return [n["assetKey"]["path"][-1] for n in nodes], nodes[0]["partitionKeys"]


def group_backfill(graphql: Graphql, dataset: str) -> tuple[float, float, list[str], list[str]]:
    """Seconds from the launch to the success of the backfill's one run, and to its creation by the backfill
    daemon; the group's assets; its partitions."""
    assets, keys = group(graphql, dataset)

    def backfill_daemon_healthy() -> bool:
        statuses = graphql(DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
        return any(s["daemonType"] == "BACKFILL" and s["healthy"] for s in statuses)

    wait_until("the backfill daemon reporting healthy", backfill_daemon_healthy, 300, poll_s=1)
    params = {  # what the dialog sends for a group of assets in the hidden asset job
        "assetSelection": [{"path": [a]} for a in assets], "partitionNames": keys, "fromFailure": False,
    }  # fmt: skip
    started = time.time()
    launched = graphql(LAUNCH_BACKFILL, params=params)["launchPartitionBackfill"]
    if launched["__typename"] != "LaunchBackfillSuccess":
        raise SystemExit(f"bench_backfill: the backfill was refused: {launched}")
    backfill_id = launched["backfillId"]
    run = finished_run(graphql, "dagster/backfill", backfill_id, 1800)
    runs = runs_tagged(graphql, "dagster/backfill", backfill_id)
    tags = {t["key"]: t["value"] for t in run["tags"]}
    if run["status"] != "SUCCESS" or len(runs) != 1:
        raise SystemExit(f"bench_backfill: backfill {backfill_id}: {len(runs)} runs, the first {run['status']}")
    if (tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")) != (
        keys[0], keys[-1]):  # fmt: skip
        raise SystemExit(f"bench_backfill: the backfill's run does not cover {keys[0]}...{keys[-1]}: {tags}")
    print(f"backfill {backfill_id}: one run over {len(assets)} assets x {len(keys)} partitions; the daemon "
          f"created it {run['creationTime'] - started:.1f} s after the launch, it started "
          f"{run['startTime'] - run['creationTime']:.1f} s later (queue, run worker), ran "
          f"{run['endTime'] - run['startTime']:.1f} s", flush=True)  # fmt: skip
    return run["endTime"] - started, run["creationTime"] - started, assets, keys


def alert_delay(graphql: Graphql, dataset: str, receiver: Any) -> float:
    """Seconds from a failed `within_budget` evaluation to its alert reaching the webhook receiver."""
    from eagle_data.defs.estimate import WITHIN_BUDGET

    keys = group(graphql, dataset)[1]

    estimate = f"{dataset}_estimate"
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": "__ASSET_JOB",
                "assetSelection": [{"path": [f"{dataset}_prompts"]}, {"path": [estimate]}]}  # fmt: skip
    tag = {"key": "bench_backfill", "value": f"alert-{time.time():.0f}"}
    tags = [tag, {"key": "dagster/asset_partition_range_start", "value": keys[0]},
            {"key": "dagster/asset_partition_range_end", "value": keys[-1]}]  # fmt: skip
    params = {"selector": selector, "executionMetadata": {"tags": tags}}
    launched = graphql(LAUNCH_RUN, params=params)["launchRun"]
    if launched["__typename"] != "LaunchRunSuccess":
        raise SystemExit(f"bench_backfill: the alert run was refused: {launched}")
    finished_run(graphql, tag["key"], tag["value"], 900)
    received = wait_until("the alert reaching the webhook", lambda: receiver.bodies and time.time(), 120, poll_s=0.1)
    [execution] = graphql(CHECK_EXECUTIONS, asset={"path": [estimate]}, check=WITHIN_BUDGET)["assetCheckExecutions"]
    if execution["evaluation"]["success"]:
        raise SystemExit(f"bench_backfill: {estimate}'s {WITHIN_BUDGET} passed; the alert came from elsewhere")
    print(f"alert: {receiver.bodies[0]['blocks'][0]['text']['text']}", flush=True)
    return received - execution["evaluation"]["timestamp"]


def cli_range_run(env: dict[str, str], assets: list[str], keys: list[str], log: Path) -> float:
    """Seconds from the CLI's start to its exit; its run's start-up and run time read from the instance."""
    import dagster as dg

    cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", LOCATION, "--select", ",".join(assets),
           "--partition-range", f"{keys[0]}...{keys[-1]}"]  # fmt: skip
    started = time.time()
    with log.open("w") as sink:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=1800).returncode
    if code:
        raise SystemExit(f"bench_backfill: the CLI range run exited with {code}; see {log}")
    ended = time.time()
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        [record] = instance.get_run_records(dg.RunsFilter(created_after=datetime.fromtimestamp(started, UTC)))
    print(f"CLI: its run started {record.start_time - started:.1f} s after the command (loading the code "
          f"location), ran {record.end_time - record.start_time:.1f} s", flush=True)  # fmt: skip
    return ended - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="b7_sharegpt")
    parser.add_argument("--alert-dataset", default="b3_magicoder")
    args = parser.parse_args()
    from eagle_data.alerts import WEBHOOK_ENV
    from eagle_data.demo import DEMO_MODEL_ENV
    from eagle_data.standins.random_model import ensure_random_model
    from eagle_data.standins.webhook import Receiver

    work = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    home = work / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    user_catalog = work / "catalog.toml"  # the alert dataset may spend 1 token: its estimate fails within_budget
    user_catalog.write_text(f"[datasets.{args.alert_dataset}]\ntoken_budget = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    env.update(EAGLE_DATA_PROFILE="demo", DAGSTER_HOME=str(home), EAGLE_DATA_CATALOG=str(user_catalog),
               **{DEMO_MODEL_ENV: str(ensure_random_model())})  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    load_before = os.getloadavg()[0]
    try:
        with Receiver() as receiver:
            ui_env = {**env, "EAGLE_DATA_ROOT": str(work / "ui"), WEBHOOK_ENV: receiver.url}
            with dagster_dev(ui_env, work / "dagster-dev.log") as graphql:
                backfill_s, pickup_s, assets, keys = group_backfill(graphql, args.dataset)
                alert_s = alert_delay(graphql, args.alert_dataset, receiver)
        cli_s = cli_range_run({**env, "EAGLE_DATA_ROOT": str(work / "cli")}, assets, keys, work / "cli.log")
    finally:
        load = f"{load_before:.1f}-{os.getloadavg()[0]:.1f}"
        print(f"logs: {work} (remove it when done)", flush=True)
    print(f"RESULT backfill_s {backfill_s:.1f} cli_s {cli_s:.1f} overhead_s {backfill_s - cli_s:.1f} "
          f"pickup_s {pickup_s:.1f} alert_s {alert_s:.1f} load {load}")  # fmt: skip


if __name__ == "__main__":
    main()
