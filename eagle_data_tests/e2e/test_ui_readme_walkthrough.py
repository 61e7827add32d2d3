"""README's "A real run" walk-through, run as written on a fresh `git clone` of this commit: its commands are
read from README.md's code block (so the test fails when README drifts from what works) and run one after
another in one bash session, each command's exit status and output checked. Long-running commands
(`dagster dev`, a line ending in `&`) run in the background while the rest run; `dagster dev` must answer
first. The clone reuses this interpreter's environment as its `.venv` (no install in a test), with the clone
first on PYTHONPATH, and the session's demo model."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_data.standins.local import stop_process_group

REPO = Path(__file__).resolve().parents[2]
SECTION = "## A real run"
UI_PORT, FILES_PORT = 3000, 3001  # `dagster dev`'s default and the files server's, as README's walk-through has them
# What each README command must print (as well as exit 0); a command not listed fails the test, so a new
# walk-through line comes with its check.
EXPECTED = {
    ". .venv/bin/activate": "",
    "export ": "",
    "python -m eagle_data.files_server &": "",
    "dagster dev": "",
    "dagster asset list": "b7_sharegpt_validated",
    "dagster asset materialize --select b7_sharegpt_prompts,b7_sharegpt,b7_sharegpt_validated --partition 00000":
        "RUN_SUCCESS",
    "eagle-data range b7_sharegpt": "--partition-range 00000...00003",
    "dagster asset materialize --select '*b7_sharegpt_validated' $(eagle-data range b7_sharegpt)": "RUN_SUCCESS",
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
    """One bash session: each command's output in logs/<i>.log and its status in logs/<i>.rc. A background
    one runs on (`dagster dev` waited for until its port answers) and its status is whether it still runs
    once the others are done; the caller then ends the session's process group."""
    lines, background = ["set -u"], []
    for i, command in enumerate(commands):
        out, rc = logs / f"{i}.log", logs / f"{i}.rc"
        if command.endswith("&") or command.startswith("dagster dev"):
            lines.append(f"{{ {command.rstrip('&').strip()} ; }} > {out} 2>&1 & echo $! > {logs / f'{i}.pid'}")
            background.append(i)
            if command.startswith("dagster dev"):
                lines.append(f"for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/{UI_PORT}) 2>/dev/null && break; "
                             "sleep 1; done")  # fmt: skip
        else:
            lines.append(f'{{ {command} ; }} > {out} 2>&1; echo $? > {rc}; [ "$(cat {rc})" = 0 ] || exit 1')
    lines += [f"kill -0 $(cat {logs / f'{i}.pid'}) 2>/dev/null; echo $? > {logs / f'{i}.rc'}" for i in background]
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


@pytest.mark.walkthrough  # minutes of CI on 2 cores: run on purpose, `pytest -m walkthrough`
@pytest.mark.browser  # `dagster dev` on README's own port, like the browser tests it starts a UI
@pytest.mark.timeout(1800)
def test_the_readme_walkthrough_runs_as_written_on_a_fresh_clone(tmp_path: Path, demo_model: Path):
    commands = walkthrough((REPO / "README.md").read_text())
    busy = [port for port in (UI_PORT, FILES_PORT) if not free(port)]
    assert not busy, f"README's ports {busy} are taken on this machine: stop what listens there"
    checks = [expectation(command) for command in commands]
    clone, logs = fresh_clone(tmp_path / "clone"), tmp_path / "logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=str(clone), EAGLE_DATA_DEMO_MODEL=str(demo_model))
    proc = subprocess.Popen(["bash", "-c", script(commands, logs)], cwd=clone, env=env, start_new_session=True)
    try:
        proc.wait(timeout=1700)
    finally:
        stop_process_group(proc)
    for i, (command, expected) in enumerate(zip(commands, checks, strict=True)):
        rc, log = logs / f"{i}.rc", logs / f"{i}.log"
        output = log.read_text() if log.exists() else ""
        assert rc.exists(), f"README command {i + 1} never ran: {command}"
        assert rc.read_text().strip() == "0", f"README command {command!r} failed:\n{output[-3000:]}"
        assert expected in output, f"README command {command!r} did not print {expected!r}:\n{output[-3000:]}"
    assert (clone / "eagle-output" / "b7_sharegpt" / "b7_sharegpt_validated" / "00003.parquet").is_file()
