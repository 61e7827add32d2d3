"""README's "A real run" walk-through, run as written on a fresh `git clone` of this commit: its commands are
read from README.md's code block (so the test fails when README drifts from what works) and run one after
another in one bash session, as a person pastes them into one terminal, each command's exit status and output
checked. The lines ending in `&` (the files server, `dagster dev`) run in the background while the rest run;
at the end the UI must answer on README's port: `/server_info`, the code location loaded with the dataset's
assets, and (where Chromium is installed) the dataset's page rendered. The clone reuses this interpreter's
environment as its `.venv` (no install in a test), with the clone first on PYTHONPATH, and the demo's own
model (SmolLM2, as `make setup` converted it)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec

from eagle_data.catalog import load_catalog
from eagle_data.standins.local import stop_process_group
from eagle_data_tests.e2e.test_ui_browser import browser, waiting  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]
SECTION = "## A real run"
UI_PORT, FILES_PORT = 3000, 3001  # `dagster dev`'s default and the files server's, as README's walk-through has them
UI = f"http://127.0.0.1:{UI_PORT}"
LOCATION = "eagle_data.definitions"  # pyproject.toml's [tool.dg] root_module + ".definitions"
GROUP = "b7_sharegpt"
KEYS = load_catalog(profile="demo")[GROUP].partition_keys  # the demo profile's shards of it
# What each README command must print (as well as exit 0); a command not listed fails the test, so a new
# walk-through line comes with its check.
EXPECTED = {
    ". .venv/bin/activate": "",
    "export ": "",
    "python -m eagle_data.files_server &": "",
    "dagster dev > dagster-dev.log 2>&1 &": "",
    "dagster asset list -m eagle_data.definitions": "b7_sharegpt_validated",
    "dagster asset materialize --select b7_sharegpt_prompts,b7_sharegpt,b7_sharegpt_validated --partition 00000":
        "b7_sharegpt 00000",
    "eagle-data range b7_sharegpt": f"--partition-range {KEYS[0]}...{KEYS[-1]}",
    "dagster asset materialize --select '*b7_sharegpt_validated' $(eagle-data range b7_sharegpt)":
        f"b7_sharegpt {KEYS[-1]}",
    "dagster sensor start catalog_order": "catalog_order",
}  # fmt: skip


def walkthrough(readme: str) -> list[str]:
    """The commands of the first bash block under SECTION, comments and blank lines left out."""
    section = readme.split(SECTION, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"README.md has no bash block under {SECTION!r}"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def expectation(command: str) -> str:
    found = [text for prefix, text in EXPECTED.items() if command == prefix or (prefix.endswith(" ") and
             command.startswith(prefix))]  # fmt: skip
    assert found, f"README walk-through command {command!r} has no check here: add it to EXPECTED"
    return found[0]


def script(commands: list[str], logs: Path) -> str:
    """One bash session, as one terminal: each command's output in logs/<i>.log and its status in logs/<i>.rc.
    A background one (ending in `&`) runs on as written; its status is whether it still runs once the others
    are done, and the caller ends the session's process group after its own checks."""
    lines, background = ["set -u"], []
    for i, command in enumerate(commands):
        out, rc = logs / f"{i}.log", logs / f"{i}.rc"
        if command.endswith("&"):
            lines.append(f"{{ {command.rstrip('&').strip()} ; }} > {out} 2>&1 & echo $! > {logs / f'{i}.pid'}")
            background.append(i)
        else:
            lines.append(f'{{ {command} ; }} > {out} 2>&1; echo $? > {rc}; [ "$(cat {rc})" = 0 ] || exit 1')
    lines += [f"kill -0 $(cat {logs / f'{i}.pid'}) 2>/dev/null; echo $? > {logs / f'{i}.rc'}" for i in background]
    lines.append(f"touch {logs / 'done'}; wait")  # the session holds its background jobs until the test ends it
    return "\n".join(lines) + "\n"


def free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def fresh_clone(target: Path) -> Path:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(target)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(target), "checkout", "-q", head.stdout.strip()], check=True)
    (target / ".venv").symlink_to(Path(sys.prefix))
    return target


def graphql(query: str) -> dict:
    request = urllib.request.Request(f"{UI}/graphql", json.dumps({"query": query}).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["data"]


@dataclass
class Session:
    clone: Path
    logs: Path
    commands: list[str]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[Session]:
    """README's block run to its end in one bash session, whose background jobs (the files server,
    `dagster dev`) still run while the tests look at them."""
    commands = walkthrough((REPO / "README.md").read_text())
    busy = [port for port in (UI_PORT, FILES_PORT) if not free(port)]
    assert not busy, f"README's ports {busy} are taken on this machine: stop what listens there"
    for command in commands:
        expectation(command)
    tmp = tmp_path_factory.mktemp("walkthrough")
    clone, logs = fresh_clone(tmp / "clone"), tmp / "logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=str(clone), EAGLE_DATA_DEMO_MODEL=str(smollm2))
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", script(commands, logs)], cwd=clone, env=env, start_new_session=True)
    try:
        deadline = started + 1700
        while not (logs / "done").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(2)
        yield Session(clone, logs, commands)
    finally:
        stop_process_group(proc)


@pytest.mark.walkthrough  # minutes of CI on 2 cores: run on purpose, `pytest -m walkthrough`
@pytest.mark.timeout(1800)
def test_the_readme_walkthrough_runs_as_written_on_a_fresh_clone(session: Session):
    background = [i for i, command in enumerate(session.commands) if command.endswith("&")]
    foreground = [i for i in range(len(session.commands)) if i not in background]
    for i in [*foreground, *background]:  # a failed command ends the session before the background ones' check
        command, rc, log = session.commands[i], session.logs / f"{i}.rc", session.logs / f"{i}.log"
        output = log.read_text() if log.exists() else ""
        assert rc.exists(), f"README command {i + 1} never ran: {command}"
        assert rc.read_text().strip() == "0", f"README command {command!r} failed:\n{output[-3000:]}"
        assert expectation(command) in output, f"README command {command!r} did not print it:\n{output[-3000:]}"
    assert (session.clone / "eagle-output" / GROUP / "b7_sharegpt_validated" / f"{KEYS[-1]}.parquet").is_file()


def dev_log(session: Session) -> str:
    """What README's `dagster dev` line printed: into the file it names, else into the session's log of it."""
    [i] = [i for i, command in enumerate(session.commands) if command.startswith("dagster dev")]
    files = [session.clone / "dagster-dev.log", session.logs / f"{i}.log"]
    return "".join(f.read_text() for f in files if f.exists())


@pytest.mark.walkthrough
@pytest.mark.timeout(1800)
def test_the_ui_the_walkthrough_started_answers_with_the_code_location_loaded(session: Session):
    """README's `dagster dev` line must leave a UI that answers: a process alive is not enough (the UI once
    never opened its port while `dagster dev` ran on)."""
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(f"{UI}/server_info", timeout=5) as response:
                info = json.load(response)
            break
        except OSError:
            assert time.monotonic() < deadline, f"{UI}/server_info never answered:\n{dev_log(session)[-3000:]}"
            time.sleep(2)
    assert info["dagster_webserver_version"]
    entries = graphql("{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                      "locationOrLoadError { __typename ... on PythonError { message } } } } } }")  # fmt: skip
    [entry] = entries["workspaceOrError"]["locationEntries"]
    assert (entry["name"], entry["loadStatus"]) == (LOCATION, "LOADED"), entry
    assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry
    nodes = graphql(f'{{ assetNodes(group: {{groupName: "{GROUP}", repositoryName: "__repository__", '
                    f'repositoryLocationName: "{LOCATION}"}}) {{ assetKey {{ path }} }} }}')["assetNodes"]  # fmt: skip
    assert {n["assetKey"]["path"][-1] for n in nodes} == {f"{GROUP}_prompts", f"{GROUP}_estimate", GROUP,
                                                          f"{GROUP}_validated"}  # fmt: skip
    with urllib.request.urlopen(f"{UI}/locations/{LOCATION}/asset-groups/{GROUP}", timeout=30) as page:
        assert page.status == 200 and b"<script" in page.read()


@pytest.fixture(scope="module")
def ui_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The browser's profile folder (test_ui_browser's `browser` fixture keeps it here)."""
    return tmp_path_factory.mktemp("ui")


@pytest.mark.walkthrough
@pytest.mark.browser
@pytest.mark.timeout(1800)
def test_the_datasets_page_renders_in_a_browser(session: Session, browser: WebDriver):  # noqa: F811
    """The page README's block leads to, rendered by Chromium: the group's four assets on its lineage."""
    browser.get(f"{UI}/locations/{LOCATION}/asset-groups/{GROUP}")
    waiting(browser, 120).until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), f"{GROUP}_validated"))
    body = browser.find_element(By.TAG_NAME, "body").text
    assert f"{GROUP}_estimate" in body and f"{GROUP}_prompts" in body
