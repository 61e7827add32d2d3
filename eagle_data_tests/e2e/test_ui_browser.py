"""The UI as a person uses it: `dagster dev` (webserver + daemon) on 127.0.0.1 and headless Debian
Chromium through ChromeDriver, one session for the module. First `hidden_states` shows no capture
partition before a mix and only the mix's shards after it. Then open the global asset lineage and find
the six dataset groups; open the b7_sharegpt group through its launch link, click "Materialize all" and
see every shard selected for one backfill. Then on the plain group page click "Materialize all", pick
partition 00000, launch, follow the toast to the run page and wait for it to report success. Then on
b7_sharegpt_validated's Checks tab click "Execute all", follow the toast to that checks-only run and wait
for success, and open the `quality_report` of the materialization and, from it, a shard's own page.
Screenshots land in the session's folder (`ui_dir`).

Needs Debian's chromium and chromium-driver (`bash .ci/services.sh` as root installs them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from eagle_data.catalog import load_catalog
from eagle_data.standins.local import free_port, stop_process_group
from eagle_data.storage import ShardStore
from eagle_data_tests.conftest import materialize_cli

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("EAGLE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("EAGLE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
# Headless, and quiet on a closed network: without the background-networking flags Chromium keeps
# dialing Google's hosts.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run", "--window-size=1600,1000",
]
LOCATION = "eagle_data.definitions"  # `dagster dev -m eagle_data.definitions` names the location after the module
LAUNCH_ALL_QUERY = "default_range=*"  # the dataset launch link's query (docs/running.md): every partition key


def wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2):
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"dagster dev did not answer within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def ui_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's one `dagster dev` session: its DAGSTER_HOME (`home`), output root (`out`), terminal log
    (`dagster-dev.log`) and the screenshots. One session for every test here: each start costs ~30 CPU-s."""
    return tmp_path_factory.mktemp("ui")


@pytest.fixture(scope="module")
def ui_env(ui_dir: Path, demo_model: Path) -> dict[str, str]:
    """The session's environment, as README's walk-through sets it: the demo profile, a fresh DAGSTER_HOME with
    the repository's dagster.yaml, and the files server's address for the outputs' links."""
    home = ui_dir / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    files_url = f"http://127.0.0.1:{free_port()}"
    env.update(EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(ui_dir / "out"), DAGSTER_HOME=str(home),
               EAGLE_DATA_DEMO_MODEL=str(demo_model), EAGLE_DATA_FILES_URL=files_url)  # fmt: skip
    return env


@pytest.fixture(scope="module")
def dagster_dev(ui_dir: Path, ui_env: dict[str, str]) -> Iterator[str]:
    """`dagster dev` on a free port, and beside it the read-only files server on $EAGLE_DATA_FILES_URL."""
    log = ui_dir / "dagster-dev.log"
    with log.open("w") as sink:
        files = subprocess.Popen([sys.executable, "-m", "eagle_data.files_server"], cwd=REPO, env=ui_env,
                                 stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        yield from serve_dagster_dev(ui_env, log)
    finally:
        stop_process_group(files)


def serve_dagster_dev(env: dict[str, str], log: Path) -> Iterator[str]:
    """`dagster dev` (webserver + daemon) on a free port with `env`, its output appended to `log`: yields its
    URL once it answers, and stops its process group after."""
    port = free_port()
    with log.open("a") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port), "-m", LOCATION],
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_server(url, proc, log)
        yield url
    finally:
        stop_process_group(proc)


@pytest.fixture(scope="module")
def browser(ui_dir: Path) -> Iterator[WebDriver]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).is_file()]
    if missing:
        reason = f"{', '.join(missing)} not installed: run `bash .ci/services.sh` as root"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={ui_dir / 'chromium-profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def waiting(browser: WebDriver, timeout_s: float = 60) -> WebDriverWait:
    """A wait that looks again when React re-renders the element it found (stale on a busy machine)."""
    return WebDriverWait(browser, timeout_s, ignored_exceptions=(StaleElementReferenceException,))


def click(wait: WebDriverWait, xpath: str) -> None:
    """Find and click in one attempt, again until the wait ends: the element found may be replaced before the click."""

    def clicked(driver: WebDriver) -> bool:
        element = ec.element_to_be_clickable((By.XPATH, xpath))(driver)
        if element:
            element.click()
        return bool(element)

    wait.until(clicked)


def run_status(base_url: str, run_id: str) -> str:
    """The run's status as the webserver's GraphQL API reports it (QUEUED, STARTED, SUCCESS, ...)."""
    query = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
    body = json.dumps({"query": query, "variables": {"id": run_id}}).encode()
    request = urllib.request.Request(f"{base_url}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"]["runOrError"]["status"]


def wait_for_run(browser: WebDriver, base_url: str, timeout_s: float = 600) -> str:
    """Follow the "Launched run" toast to the run page and, once the run has ended, the status that page shows.
    The wait itself asks the webserver's API on a blank tab: a live run page keeps Chromium's renderer busy at
    about 0.7 of a core, which the run's own steps need on a 2-core machine."""
    wait = waiting(browser)
    click(wait, "//*[contains(text(), 'Launched run')]/following::*[normalize-space(text())='View'][1]")
    wait.until(ec.url_contains("/runs/"))
    run_page = browser.current_url
    run_id = run_page.split("/runs/")[1].split("?")[0].strip("/")
    browser.get("about:blank")
    deadline = time.monotonic() + timeout_s
    while (status := run_status(base_url, run_id)) not in ("SUCCESS", "FAILURE", "CANCELED"):
        assert time.monotonic() < deadline, f"run {run_id} still {status} after {timeout_s:.0f} s"
        time.sleep(2)
    browser.get(run_page)
    shown = "//*[normalize-space(text())='Success' or normalize-space(text())='Failure' or " \
            "normalize-space(text())='Canceled']"
    return wait.until(ec.visibility_of_element_located((By.XPATH, shown))).text


def test_ui_capture_partitions_follow_the_mix(dagster_dev: str, browser: WebDriver, ui_dir: Path):
    """`hidden_states` shows no partition before a mix and one per capture shard after `training_mix` sets them
    (here as its body does, for the demo's 210-row mix: one shard of 2,000 rows), and "Materialize" → "All"
    selects only that shard. Before, it showed 500 static partitions, 499 of which could never fill. Runs
    first in this module's session, on an instance without a mix."""
    from eagle_data.defs.drafter import follow_the_mix

    wait = WebDriverWait(browser, 60)
    page = f"{dagster_dev}/assets/hidden_states?view=partitions"
    browser.get(page)
    wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), "Missing (0)"))
    with dg.DagsterInstance.from_config(str(ui_dir / "home")) as instance:
        assert follow_the_mix(instance, 210) == ["00000"]
    browser.get(page)
    wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), "Missing (1)"))
    click(wait, "//button[contains(., 'Materialize')]")
    click(wait, "//button[normalize-space(.)='Confirm']")  # Dagster's notice: training_mix is not materialized
    click(wait, "//*[@role='dialog']//*[normalize-space(text())='All']")
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "[role=dialog]"), "1 partition"))
    browser.save_screenshot(str(ui_dir / "0-capture-dialog.png"))
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()


@pytest.mark.timeout(1500)  # bounds a loaded machine: one run took over 5 min at load 20 on 2 cores
def test_ui_materializes_a_b7_partition_reruns_its_checks_and_opens_the_report(
    dagster_dev: str, browser: WebDriver, ui_dir: Path, ui_env: dict[str, str]
):
    wait = waiting(browser)
    keys = load_catalog(profile="demo")["b7_sharegpt"].partition_keys
    prompts = materialize_cli(ui_env, "--select", "b7_sharegpt_prompts", "--partition-range", f"{keys[0]}...{keys[-1]}")
    assert prompts.returncode == 0, prompts.stderr[-3000:]
    store = ShardStore(ui_env["EAGLE_DATA_ROOT"])
    dataset_rows = sum(store.read_shard("b7_sharegpt", "b7_sharegpt_prompts", key).height for key in keys)
    browser.get(f"{dagster_dev}/asset-groups")
    for group in load_catalog(profile="demo"):  # each group shows twice: in the sidebar tree and as a node of the graph
        wait.until(lambda d, g=group: len(d.find_elements(By.XPATH, f"//*[normalize-space(text())='{g}']")) >= 2)
    wait.until(lambda d: "fetching statuses" not in d.find_element(By.TAG_NAME, "body").text)
    browser.save_screenshot(str(ui_dir / "1-asset-graph.png"))

    # A dataset's launch link (docs/running.md) opens "Materialize all" with every shard selected: one
    # single-run backfill of the whole group (test_ui_backfill.py follows it through the daemon). Dagster's
    # dialog starts empty ("Custom", 0 partitions) and takes its selection from the page's query string.
    group_page = f"{dagster_dev}/locations/{LOCATION}/asset-groups/b7_sharegpt"
    browser.get(f"{group_page}?{LAUNCH_ALL_QUERY}")
    click(wait, "//button[contains(., 'Materialize all')]")
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "[role=dialog]"), f"{len(keys)} partitions"),
               f"the launch link did not preselect all {len(keys)} partitions")  # fmt: skip
    dialog = browser.find_element(By.CSS_SELECTOR, "[role=dialog]")
    assert set(keys) <= set(dialog.text.splitlines()), dialog.text  # each key shows as a chosen tag
    assert dialog.find_elements(By.XPATH, ".//button[normalize-space(.)='Launch backfill' and not(@disabled)]")
    browser.save_screenshot(str(ui_dir / "2-group-launch-dialog.png"))

    browser.get(group_page)  # one shard, picked by hand
    click(wait, "//button[contains(., 'Materialize all')]")
    click(wait, "//*[text()='Select a partition or create one']")
    click(wait, "//span[normalize-space(text())='00000']")
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()  # close the partition picker, keep the dialog
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "[role=dialog]"), "1 partition"))
    browser.save_screenshot(str(ui_dir / "3-launch-dialog.png"))
    click(wait, "//button[contains(., 'Launch 1 run')]")
    outcome = wait_for_run(browser, dagster_dev)
    browser.save_screenshot(str(ui_dir / "4-run.png"))
    assert outcome == "Success", (ui_dir / "dagster-dev.log").read_text()[-3000:]
    assert "partition: 00000" in browser.find_element(By.TAG_NAME, "body").text
    assert (ui_dir / "out" / "b7_sharegpt" / "b7_sharegpt_validated" / "00000.parquet").is_file()

    # "Row count" is the latest materialization's, here shard 00000's (10 rows): it reads the dataset's rows.
    browser.get(f"{dagster_dev}/assets/b7_sharegpt_prompts")
    shown = "(//*[normalize-space(text())='Row count']/following::*[normalize-space(text())!=''])[1]"
    assert waiting(browser).until(ec.visibility_of_element_located((By.XPATH, shown))).text == str(dataset_rows)
    assert dataset_rows > store.read_shard("b7_sharegpt", "b7_sharegpt_prompts", "00000").height

    # Re-run the checks from the asset's Checks tab, without materializing anything.
    browser.get(f"{dagster_dev}/assets/b7_sharegpt_validated?view=checks")
    click(wait, "//button[normalize-space(.)='Execute all' and not(@disabled)]")
    outcome = wait_for_run(browser, dagster_dev, timeout_s=300)
    browser.save_screenshot(str(ui_dir / "5-checks-run.png"))
    assert outcome == "Success", (ui_dir / "dagster-dev.log").read_text()[-3000:]
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "b7_sharegpt_quality_checks" in body and "partition: 00000" not in body  # a checks-only run

    # The materialization shows the report's headline figures and a link to the report that opens: on the
    # files server (a file:// link would not open from an http:// page).
    browser.get(f"{dagster_dev}/assets/b7_sharegpt_validated?view=events")
    wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), "quality_report_link"))
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "dataset_rows" in body and "dataset_checks" in body and "dataset_shard_table" in body
    assert not browser.find_elements(By.XPATH, "//a[starts-with(@href, 'file:')]")
    report = f"{ui_env['EAGLE_DATA_FILES_URL']}/b7_sharegpt/b7_sharegpt_quality/index.html"
    click(wait, f"//a[@href='{report}' and normalize-space(.)='{report}']")  # opens in a new tab
    wait.until(lambda d: len(d.window_handles) == 2)
    browser.switch_to.window(browser.window_handles[-1])
    wait.until(ec.title_contains("b7_sharegpt"))
    assert browser.current_url == report and browser.find_element(By.TAG_NAME, "h1").text
    assert "decontamination" in browser.find_element(By.TAG_NAME, "body").text  # all nine checks listed
    browser.save_screenshot(str(ui_dir / "6-report.png"))
    click(wait, "//a[normalize-space(text())='shard 00000']")  # the dataset page links each shard's own page
    wait.until(ec.title_contains("shard 00000"))
    browser.save_screenshot(str(ui_dir / "7-shard-report.png"))
    browser.close()
    browser.switch_to.window(browser.window_handles[0])
    log = (ui_dir / "dagster-dev.log").read_text()
    assert "BetaWarning" not in log and "PreviewWarning" not in log
