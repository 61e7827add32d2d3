"""The design card's commands on a fresh checkout, from its root as the README types them: `dagster dev` and
`dg dev` there serve their UI with every variable README exports set (a `DAGSTER_MODULE_NAME` once stopped their
webserver), the card's `dagster asset materialize --select b7_sharegpt` says in one line what it needs (a shard,
and in a shell without README's exports a code location), and with the range `eagle-data range` prints it finds
the code location without `-m` and writes every shard."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import dagster._cli.asset as asset_cli
import dagster._cli.workspace.cli_target as cli_target
import polars as pl
import pytest

from eagle_data.catalog import load_catalog
from eagle_data.cli import NO_PARTITION, no_partition_line
from eagle_data.standins.local import free_port, stop_process_group
from eagle_data.standins.openai_fake import FakeOpenAI
from eagle_data_tests.conftest import materialize_cli
from eagle_data_tests.e2e.test_ui_readme_walkthrough import walkthrough

REPO = Path(__file__).resolve().parents[2]
DS = "b7_sharegpt"
CARD = ["dagster", "asset", "materialize", "--select", DS]  # docs/design.md and the design card, as written
IN_PROCESS = json.dumps({"execution": {"config": {"in_process": {}}}})
NO_LOCATION = "Invalid set of CLI arguments for loading repository/job"  # Dagster's own UsageError


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a fresh clone of this tree holds: the files git tracks or would track, nothing it ignores (no
    venv, no instance state, no outputs)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True)  # fmt: skip
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    clone = tmp_path_factory.mktemp("clone") / "eagle-data"
    for name in filter(None, listed.stdout.split("\0")):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    return clone


def readme_exports(root: Path) -> dict[str, str]:
    """Every variable README's walk-through exports, as its `export` lines set them at `root`."""
    exported = {}
    for line in walkthrough((REPO / "README.md").read_text()):
        if line.startswith("export "):
            for pair in shlex.split(line.removeprefix("export ").replace("$PWD", str(root))):
                name, _, value = pair.partition("=")
                exported[name] = value
    return exported


def fresh_shell(clone: Path) -> dict[str, str]:
    """A fresh shell with the venv active: this interpreter's PATH and the checkout on PYTHONPATH, none of the
    project's or Dagster's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_", "OPENAI_"))}
    env.update(PYTHONPATH=str(clone), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def readme_env(clone: Path, **extra: str) -> dict[str, str]:
    """The shell after README's `. .venv/bin/activate` and `export` lines, in the checkout."""
    return {**fresh_shell(clone), **readme_exports(clone), **extra}


def wait_for_ui(url: str, proc: subprocess.Popen, timeout_s: float = 240) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2):
                return True
        except OSError:
            time.sleep(1)
    return False


@pytest.mark.parametrize("command", [["dagster", "dev", "--port"], ["dg", "dev", "--port"]], ids=["dagster", "dg"])
def test_dev_at_the_root_with_the_readme_exports_serves_its_ui_on_the_root_dagster_yaml(
    checkout: Path, command: list[str], tmp_path: Path
):
    """Regression: README exported DAGSTER_MODULE_NAME; `dagster dev` passes its webserver a workspace file,
    the webserver then had two targets, exited with a UsageError, and port 3000 never opened."""
    env, port, log = readme_env(checkout), free_port(), tmp_path / "dev.log"
    assert env["DAGSTER_HOME"] == str(checkout)
    with log.open("w") as sink:
        proc = subprocess.Popen([*command, str(port)], cwd=checkout, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        served = wait_for_ui(f"http://127.0.0.1:{port}", proc)
    finally:
        stop_process_group(proc)
    text = log.read_text()
    assert served, f"{' '.join(command)} never answered /server_info:\n{text[-3000:]}"
    assert "will not be used" not in text and "No dagster instance configuration file" not in text, text


def test_the_card_command_as_written_says_in_one_line_which_shards_to_add(checkout: Path):
    """With README's exports Dagster finds the code location; its "no --partition" refusal was a 40-line
    CheckError traceback: now one line with the flag to add."""
    out = subprocess.run(CARD, cwd=checkout, env=readme_env(checkout), capture_output=True, text=True, timeout=300)
    said = [line for line in out.stderr.splitlines() if line.startswith("eagle-data: ")]
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert said == [f"eagle-data: {NO_PARTITION}: every dataset asset is partitioned by shard; add `--partition "
                    f"00000` for one shard, or `$(eagle-data range {DS})` for every shard in one run"], out.stderr
    assert NO_PARTITION in Path(asset_cli.__file__).read_text()  # Dagster's own words, quoted


@pytest.mark.parametrize("argv", [["dagster", "asset", "materialize", "--select", "b7_sharegpt_validated"],
                                  ["dg", "launch", "--assets=*b7_sharegpt"], ["dagster", "asset", "materialize"]])
def test_the_one_line_names_the_range_of_the_selected_dataset(argv: list[str]):
    line = no_partition_line(argv, ["b7_sharegpt", "b3_magicoder"])
    dataset = "DATASET" if argv[-1] == "materialize" else DS
    assert line.endswith(f"or `$(eagle-data range {dataset})` for every shard in one run")


def test_the_card_command_in_a_fresh_shell_gets_dagsters_line_and_readme_says_what_to_add(checkout: Path):
    """Without README's exports Dagster's CLI cannot know the code location: `dagster asset materialize` reads
    no file for it (docs/running.md cites the lines). Its own one-line refusal is what a fresh shell gets, and
    README names it beside the export that fixes it."""
    out = subprocess.run(CARD, cwd=checkout, env=fresh_shell(checkout), capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.splitlines()[-1] == f"Error: {NO_LOCATION}. See --help for details."
    assert "Traceback" not in out.stderr
    assert NO_LOCATION in Path(cli_target.__file__).read_text()
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"Dagster's \"{NO_LOCATION}\"" in readme and "DAGSTER_CLI_ASSET_MATERIALIZE_MODULE_NAME" in readme


def test_the_card_command_takes_every_shard_from_the_root_without_a_module_flag(
    checkout: Path, server: FakeOpenAI, demo_model: Path, tmp_path: Path
):
    out = tmp_path / "out"
    env = readme_env(checkout, EAGLE_DATA_ROOT=str(out), EAGLE_DATA_DEMO_MODEL=str(demo_model),
                     EAGLE_DATA_ENGINE="openai", EAGLE_DATA_MODEL="m", OPENAI_API_KEY="sk-test",
                     EAGLE_DATA_BASE_URL=f"http://127.0.0.1:{server.port}/v1",
                     EAGLE_DATA_TARGET_TOKENIZER=str(demo_model))  # fmt: skip  (target "auto": model m's tokenizer)
    printed = subprocess.run([sys.executable, "-m", "eagle_data.cli", "range", DS], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    keys = load_catalog(profile="demo")[DS].partition_keys  # the demo profile's shards
    assert printed.stdout.strip() == f"--partition-range {keys[0]}...{keys[-1]}", printed.stderr
    flag = printed.stdout.split()

    dg_cli = shutil.which("dg", path=str(Path(sys.executable).parent))
    if dg_cli is None:
        pytest.fail("the dg CLI (dagster-dg-cli, a dependency) is not installed")
    upstream = subprocess.run([dg_cli, "launch", "--assets", f"{DS}_prompts", *flag, "--config-json", IN_PROCESS],
                              cwd=checkout, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert upstream.returncode == 0, (upstream.stdout + upstream.stderr)[-3000:]
    card = materialize_cli(env, "--select", DS, *flag, cwd=checkout, timeout_s=300)
    printed = card.stdout + card.stderr
    assert card.returncode == 0, printed[-3000:]
    # The root dagster.yaml's python_log_level: a run prints INFO and up (a run the UI starts prints into the
    # `dagster dev` terminal the same way), its DEBUG events only in the event log (checked below).
    assert " - DEBUG - " not in printed and f"{DS} {keys[-1]}:" in printed, printed[-3000:]

    shards = sorted(p.name for p in (out / DS / DS).glob("*.parquet"))
    assert shards == [f"{key}.parquet" for key in keys]
    for name in shards:  # every prompt of every shard answered
        prompts = pl.read_parquet(out / DS / f"{DS}_prompts" / name)["prompt_id"]
        replies = pl.read_parquet(out / DS / DS / name)
        assert replies["prompt_id"].sort().to_list() == prompts.sort().to_list()
        assert replies["status"].unique().to_list() == ["ok"]
    with dg.DagsterInstance.from_config(str(checkout)) as instance:  # the root's dagster.yaml, its SQLite
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        runs = instance.get_runs()
        assert instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_START)
        records = instance.fetch_materializations(dg.AssetKey(DS), limit=10).records
        shard_uris = {r.partition_key: r.asset_materialization.metadata["dagster/uri"].value for r in records}
    assert len(runs) == 2 and (checkout / "history" / "runs.db").is_file()
    assert {r.tags.get("dagster/asset_partition_range_end") for r in runs} >= {keys[-1]}
    assert shard_uris == {key: str(out / DS / DS / f"{key}.parquet") for key in keys}  # each shard's URI
