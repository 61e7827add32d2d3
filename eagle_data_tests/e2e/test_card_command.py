"""The design card's commands on a fresh checkout, from its root as the README types them: `dagster dev` there
reads the root dagster.yaml with no warning, and `dagster asset materialize --select b7_sharegpt` with the
range `eagle-data range` prints finds the code location without `-m` and writes every shard."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import dagster._cli.asset as asset_cli
import polars as pl
import pytest

from eagle_data.standins.local import free_port, stop_process_group
from eagle_data.standins.openai_fake import FakeOpenAI
from eagle_data_tests.conftest import materialize_cli

REPO = Path(__file__).resolve().parents[2]
DS = "b7_sharegpt"
IN_PROCESS = json.dumps({"execution": {"config": {"in_process": {}}}})


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


def readme_env(clone: Path, **extra: str) -> dict[str, str]:
    """The README's exports, in the checkout: DAGSTER_HOME is its root, the module named by env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_", "OPENAI_"))}
    env.update(DAGSTER_HOME=str(clone), DAGSTER_MODULE_NAME="eagle_data.definitions", EAGLE_DATA_PROFILE="demo",
               PYTHONPATH=str(clone), **extra)  # fmt: skip
    return env


def test_dagster_dev_at_the_root_starts_on_the_root_dagster_yaml_with_no_warning(checkout: Path):
    env = readme_env(checkout)
    del env["DAGSTER_MODULE_NAME"]  # `dagster dev` finds the location in pyproject.toml's [tool.dg]
    proc = subprocess.Popen([sys.executable, "-m", "dagster", "dev", "--port", str(free_port())], cwd=checkout,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while proc.stdout and time.monotonic() < deadline:
            if not select.select([proc.stdout], [], [], 1)[0]:
                continue
            lines.append(line := proc.stdout.readline())
            if not line or "Launching Dagster services" in line:
                break
    finally:
        stop_process_group(proc)
    log = "".join(lines)
    assert "Launching Dagster services" in log, log[-2000:]
    assert "will not be used" not in log and "No dagster instance configuration file" not in log, log


def test_the_card_command_takes_every_shard_from_the_root_without_a_module_flag(
    checkout: Path, server: FakeOpenAI, demo_model: Path, tmp_path: Path
):
    out = tmp_path / "out"
    env = readme_env(checkout, EAGLE_DATA_ROOT=str(out), EAGLE_DATA_DEMO_MODEL=str(demo_model),
                     EAGLE_DATA_ENGINE="openai", EAGLE_DATA_MODEL="m", OPENAI_API_KEY="sk-test",
                     EAGLE_DATA_BASE_URL=f"http://127.0.0.1:{server.port}/v1")  # fmt: skip
    printed = subprocess.run([sys.executable, "-m", "eagle_data.cli", "range", DS], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert printed.stdout.strip() == "--partition-range 00000...00003", printed.stderr
    flag = printed.stdout.split()

    dg_cli = shutil.which("dg", path=str(Path(sys.executable).parent))
    if dg_cli is None:
        pytest.fail("the dg CLI (dagster-dg-cli, a dependency) is not installed")
    upstream = subprocess.run([dg_cli, "launch", "--assets", f"{DS}_prompts", *flag, "--config-json", IN_PROCESS],
                              cwd=checkout, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert upstream.returncode == 0, (upstream.stdout + upstream.stderr)[-3000:]
    card = materialize_cli(env, "--select", DS, *flag, cwd=checkout, timeout_s=300)
    assert card.returncode == 0, (card.stdout + card.stderr)[-3000:]

    shards = sorted(p.name for p in (out / DS / DS).glob("*.parquet"))
    assert shards == [f"0000{i}.parquet" for i in range(4)]
    for name in shards:  # every prompt of every shard answered
        prompts = pl.read_parquet(out / DS / f"{DS}_prompts" / name)["prompt_id"]
        replies = pl.read_parquet(out / DS / DS / name)
        assert replies["prompt_id"].sort().to_list() == prompts.sort().to_list()
        assert replies["status"].unique().to_list() == ["ok"]
    with dg.DagsterInstance.from_config(str(checkout)) as instance:  # the root's dagster.yaml, its SQLite
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        runs = instance.get_runs()
        records = instance.fetch_materializations(dg.AssetKey(DS), limit=10).records
        shard_uris = {r.partition_key: r.asset_materialization.metadata["dagster/uri"].value for r in records}
    assert len(runs) == 2 and (checkout / "history" / "runs.db").is_file()
    assert {r.tags.get("dagster/asset_partition_range_end") for r in runs} >= {"00003"}
    assert shard_uris == {f"0000{i}": str(out / DS / DS / f"0000{i}.parquet") for i in range(4)}  # each shard's URI


def test_the_readme_quotes_dagsters_own_message_for_the_bare_form():
    """The one-line explanation quotes the failure Dagster's CLI raises for a partitioned asset with no shard."""
    message = "Asset has partitions, but no '--partition' option was provided"
    assert message in Path(asset_cli.__file__).read_text()
    assert message in " ".join((REPO / "README.md").read_text().split())
