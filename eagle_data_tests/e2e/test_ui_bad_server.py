"""The UI with a bad server, as a data engineer meets it: `dagster dev` (webserver + daemon) on the demo
catalog with the openai engine pointed at a stand-in that answers every request "OK." (the DFlash run's 87%),
no price configured, and headless Chromium reading the pages.

Two backfills run at once through the daemon. `b7_sharegpt`'s group (estimate included): the canary fails,
so the estimate's step fails on it and generation never starts, the canary's page calls it a blocking check
(it once said "non-blocking" of a check that stops generation), and the estimate's page must say the dollars
are unknown (no price), never "$0.00", and never that generation may start. `b3_magicoder` without its
estimate (no canary was ever judged for it, so generation pays): every shard materializes and then fails its
blocking quality gates, so the one run fails; the backfill must end "Failed", not "Succeeded" (Dagster counts
only missing materializations; the `backfill_status` sensor corrects it, docs/running.md).

Needs Debian's chromium and chromium-driver (`bash .ci/services.sh` as root installs them)."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec

from eagle_data.catalog import load_catalog
from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data_tests.e2e.test_ui_browser import REPO, browser, serve_dagster_dev, waiting  # noqa: F401 (a fixture)
from eagle_data_tests.fixtures_stages import standin_catalog

pytestmark = pytest.mark.browser

# b3: single-turn, 36 replies, under the breaker's 50 (it would stop generation itself)
CANARIED, UNCANARIED = "b7_sharegpt", "b3_magicoder"
LAUNCH = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL = """query($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill {
  status runs(limit: 10) { id status } error { message } } } }"""
FINISHED_RUN = {"SUCCESS", "FAILURE", "CANCELED"}
FINISHED_BACKFILL = {"COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def graphql(base_url: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{base_url}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    assert "errors" not in answer, answer
    return answer["data"]


def launch_backfill(base_url: str, assets: list[str]) -> str:
    """One backfill of every partition of `assets`, as "Materialize all" launches it (single run)."""
    params = {"assetSelection": [{"path": [name]} for name in assets], "allPartitions": True}
    launched = graphql(base_url, LAUNCH, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


def backfill_state(base_url: str, backfill_id: str) -> dict[str, Any]:
    return graphql(base_url, BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]


def wait_until(what: str, done: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := done()):
        assert time.monotonic() < deadline, f"{what} after {timeout_s:.0f} s"
        time.sleep(2)
    return found


@pytest.fixture(scope="module")
def ui_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui-bad-server")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI(Faults(fixed_text="OK.", cost_per_token=0.0))  # reports no cost: no price known
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def bad_ui(ui_dir: Path, demo_model: Path, server: FakeOpenAI) -> Iterator[str]:
    """`dagster dev` on the demo catalog, the openai engine at the stand-in, no price, a fresh DAGSTER_HOME."""
    home = ui_dir / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_", "OPENAI_"))}
    env.update(EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(ui_dir / "out"), DAGSTER_HOME=str(home),
               EAGLE_DATA_DEMO_MODEL=str(demo_model), EAGLE_DATA_ENGINE="openai", EAGLE_DATA_MODEL="m",
               EAGLE_DATA_BASE_URL=f"http://127.0.0.1:{server.port}/v1", OPENAI_API_KEY="sk-test",
               EAGLE_DATA_CATALOG=str(standin_catalog(ui_dir)))  # fmt: skip
    yield from serve_dagster_dev(env, ui_dir / "dagster-dev.log")


@pytest.fixture(scope="module")
def backfills(bad_ui: str) -> dict[str, dict[str, Any]]:
    """Both backfills, launched together and followed until their runs end (the same daemon iteration
    creates both runs)."""
    ids = {
        CANARIED: launch_backfill(bad_ui, [f"{CANARIED}_prompts", f"{CANARIED}_estimate", CANARIED,
                                           f"{CANARIED}_validated"]),
        UNCANARIED: launch_backfill(bad_ui, [f"{UNCANARIED}_prompts", UNCANARIED, f"{UNCANARIED}_validated"]),
    }  # fmt: skip

    def ended() -> dict[str, dict[str, Any]] | None:
        states = {ds: backfill_state(bad_ui, backfill_id) for ds, backfill_id in ids.items()}
        runs = [run for state in states.values() for run in state["runs"]]
        if len(runs) == len(ids) and all(run["status"] in FINISHED_RUN for run in runs):
            return {ds: {"id": ids[ds], **state} for ds, state in states.items()}
        return None

    return wait_until("the backfills' runs had not ended", ended, timeout_s=900)


def page_text(browser: WebDriver, url: str, expect: str, timeout_s: float = 60) -> str:  # noqa: F811
    browser.get(url)
    waiting(browser, timeout_s).until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), expect))
    return browser.find_element(By.TAG_NAME, "body").text


@pytest.mark.timeout(1500)
def test_a_failed_canary_is_a_blocking_check_and_the_estimate_says_dollars_are_unknown(
    bad_ui: str, backfills: dict[str, dict[str, Any]], browser: WebDriver, ui_dir: Path  # noqa: F811
):
    [run] = backfills[CANARIED]["runs"]
    assert run["status"] == "FAILURE"
    # The run's failed step is the estimate's, on its blocking check; Dagster skipped generation.
    page_text(browser, f"{bad_ui}/runs/{run['id']}", "blocking asset check")
    browser.save_screenshot(str(ui_dir / "1-canary-run.png"))
    # The canary's own page says what it does: it blocks.
    check = f"{bad_ui}/assets/{CANARIED}_estimate?view=checks&checkDetail=canary"
    body = page_text(browser, check, "This is a blocking asset check.")
    browser.save_screenshot(str(ui_dir / "2-canary-check.png"))
    assert "non-blocking" not in body
    # The estimate's page: its summary says the dollars are unknown, and nothing shows a made-up $0.00.
    body = page_text(browser, f"{bad_ui}/assets/{CANARIED}_estimate?view=events", "Dollars: unknown")
    browser.save_screenshot(str(ui_dir / "3-estimate.png"))
    assert "$0.00" not in body and "Canary: FAILED" in body and "may start" not in body


@pytest.mark.timeout(1500)
def test_a_backfill_whose_run_failed_blocking_checks_ends_failed(
    bad_ui: str, backfills: dict[str, dict[str, Any]], browser: WebDriver, ui_dir: Path  # noqa: F811
):
    found = backfills[UNCANARIED]
    [run] = found["runs"]
    assert run["status"] == "FAILURE"  # every shard failed its blocking gates
    spec = load_catalog(profile="demo")[UNCANARIED]
    assert all((ui_dir / "out" / UNCANARIED / f"{UNCANARIED}_validated" / f"{k}.parquet").is_file()
               for k in spec.partition_keys)  # fmt: skip  (so Dagster alone would call the backfill a success)
    ended = wait_until(  # the daemon ends it; the backfill_status sensor (every 60 s) corrects it
        "the backfill did not end failed",
        lambda: (s := backfill_state(bad_ui, found["id"]))["status"] == "COMPLETED_FAILED" and s,
        timeout_s=300,
    )
    assert run["id"] in ended["error"]["message"] and "empty_response" in ended["error"]["message"]
    body = page_text(browser, f"{bad_ui}/runs/b/{found['id']}?tab=runs", "Failed")
    browser.save_screenshot(str(ui_dir / "4-backfill.png"))
    assert "Succeeded" not in body
