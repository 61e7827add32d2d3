"""The `hidden_states` checks shard by shard, read back from a real Dagster instance: a range run over three
capture shards with one shard corrupted fails only that shard's evaluation, each evaluation names its
partition, the materialization it judged and the sha256 of the bytes it read; a checks-only run (the Checks
tab's "Execute all") re-verifies the stored shards without capturing; and the `dagster` CLI
materializes a capture shard on the demo profile with its checks green."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from eagle_data import layout
from eagle_data.catalog import load_catalog
from eagle_data.defs.drafter import follow_the_mix
from eagle_data.defs.instance import latest_materializations
from eagle_data.defs.metadata import SHARD_DIGEST
from eagle_data.drafter import verify
from eagle_data_tests.e2e.test_demo_catalog import undocumented
from eagle_data_tests.fixtures_checks import latest_evaluations
from eagle_data_tests.integration.test_drafter_capture import mix_frame, write_mix

ROOT = Path(__file__).resolve().parents[2]
KEY = dg.AssetKey(layout.HIDDEN_STATES_ASSET)
CHECKS = [dg.AssetCheckKey(KEY, name) for name in verify.CHECKS]
SHARDS = ["00000", "00001", "00002"]
RANGE = {"dagster/asset_partition_range_start": SHARDS[0], "dagster/asset_partition_range_end": SHARDS[-1]}


def metadata_names(result: dg.ExecuteInProcessResult) -> set[str]:
    names = {n for m in result.asset_materializations_for_node(KEY.path[-1]) for n in m.metadata}
    return names | {n for e in result.get_asset_check_evaluations() for n in e.metadata}


def digests(instance: dg.DagsterInstance) -> dict[str, str]:
    """partition -> the `shard_sha256` of its latest materialization."""
    latest = latest_materializations(instance, KEY, SHARDS)
    return {p: str(r.asset_materialization.metadata[SHARD_DIGEST].value) for p, r in latest.items()}


def captured(instance: dg.DagsterInstance) -> dict[str, bool]:
    """partition -> whether its latest materialization's run captured it (false: unchanged, skipped)."""
    latest = latest_materializations(instance, KEY, SHARDS)
    return {p: r.asset_materialization.metadata["captured"].value for p, r in latest.items()}


@pytest.fixture
def capture_asset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_model: Path) -> dict[str, Any]:
    """`hidden_states` on the demo profile over a 12-row mix in three capture shards of 4 rows."""
    from eagle_data.defs.drafter import CaptureResource, build_drafter_assets
    from eagle_data.defs.resources import StorageResource

    user = tmp_path / "catalog.toml"
    user.write_text("[drafter.capture]\nshard_rows = 4\nmax_rows = 12\n")
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model))
    monkeypatch.delenv("EAGLE_DATA_CAPTURE_CHECKPOINT", raising=False)
    # the mix's ids are of the demo model's vocabulary, named as a catalog target (the rows name none)
    specs = [spec.model_copy(update={"target": "demo"}) for spec in load_catalog(profile="demo").values()]
    write_mix(tmp_path / "out", mix_frame(specs[0].name, rows=12))
    asset = next(a for a in build_drafter_assets(specs) if a.key == KEY)
    resources = {"storage": StorageResource(root=str(tmp_path / "out")), "capture": CaptureResource(device="cpu")}
    return {"asset": asset, "resources": resources, "root": tmp_path / "out"}


def test_a_range_run_with_one_corrupt_shard_fails_that_shards_evaluation_only(
    capture_asset: dict[str, Any], tmp_path: Path
) -> None:
    asset, resources = capture_asset["asset"], capture_asset["resources"]
    with dg.instance_for_test() as instance:
        assert follow_the_mix(instance, 12) == SHARDS  # what training_mix does on a 12-row mix
        clean = dg.materialize([asset], resources=resources, instance=instance, tags=RANGE)
        assert clean.success and sorted(captured(instance)) == SHARDS
        assert undocumented(metadata_names(clean)) == [], "describe these figures in docs/figures.md"
        before = digests(instance)
        first = latest_evaluations(instance, CHECKS, SHARDS)
        assert len(first) == 15 and all(e.passed for e in first.values())

        path = Path(str(clean.asset_materializations_for_node(KEY.path[-1])[0].metadata["path"].value))
        planted = path / "specforge-eagle3" / "rows_0-2000" / "data_5.ckpt"  # row 5: in shard 00001
        planted.write_bytes(planted.read_bytes()[:-100])  # a truncated file
        corrupt = dg.materialize([asset], resources=resources, instance=instance, tags=RANGE, raise_on_error=False)
        assert not corrupt.success
        error = str(corrupt.get_step_failure_events()[0].step_failure_data.error)
        assert "blocking check(s) failed: ids_match_mix on 00001;" in error

        found = latest_evaluations(instance, CHECKS, SHARDS)
        assert {k for k, e in found.items() if not e.passed} == {(verify.IDS, "00001")}
        assert len(found) == 15 and {e.judged_run_id for e in found.values()} == {corrupt.run_id}
        after = digests(instance)
        assert all(e.shard_sha256 == after[partition] for (_, partition), e in found.items())
        assert after["00000"] == before["00000"] and after["00001"] != before["00001"]  # the bytes read changed
        line = found[(verify.IDS, "00001")].description
        assert line.startswith("shard 00001: 1 stored sample(s) missing, unreadable or unlike their mix row")
        assert "specforge-eagle3 row 5 unreadable" in line and "\n" not in line
        assert line.endswith("re-materialize hidden_states partition 00001")

        again = dg.materialize([asset], resources=resources, instance=instance, tags=RANGE)
        assert again.success  # the failed shard lost its record: captured again; the others skipped
        assert captured(instance) == {"00000": False, "00001": True, "00002": False}
        assert all(e.passed for e in latest_evaluations(instance, CHECKS, SHARDS).values())


def checks_only(capture_asset: dict[str, Any], instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """What the Checks tab's "Execute all" launches: every check of hidden_states, not the asset, no partition."""
    defs = dg.Definitions(assets=[capture_asset["asset"]], resources=capture_asset["resources"])
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection=set(CHECKS)
    )
    return job.execute_in_process(instance=instance, raise_on_error=False)


def stored_files(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under the capture's folder: its modification time and bytes."""
    return {str(f.relative_to(root)): (f.stat().st_mtime_ns, f.read_bytes()) for f in root.rglob("*") if f.is_file()}


def test_a_checks_only_run_re_verifies_the_stored_shards_without_capturing(capture_asset: dict[str, Any]) -> None:
    asset, resources = capture_asset["asset"], capture_asset["resources"]
    with dg.instance_for_test() as instance:
        follow_the_mix(instance, 12)
        clean = dg.materialize([asset], resources=resources, instance=instance, tags=RANGE)
        assert clean.success
        path = Path(str(clean.asset_materializations_for_node(KEY.path[-1])[0].metadata["path"].value))
        before = stored_files(path)
        assert any(name.startswith("_shards/") for name in before)  # the shards' records are in there

        verified = checks_only(capture_asset, instance)
        assert verified.success
        found = {(e.check_name, e.partition): e for e in verified.get_asset_check_evaluations()}
        assert sorted(found) == sorted((name, shard) for name in verify.CHECKS for shard in SHARDS)
        assert all(e.passed for e in found.values())
        assert {e.target_materialization_data.run_id for e in found.values()} == {clean.run_id}
        assert all(e.metadata["rows_recaptured"].value > 0 for e in found.values())  # the seeded re-capture ran
        assert verified.get_asset_materialization_events() == []
        assert stored_files(path) == before  # nothing captured, nothing rewritten

        planted = path / "specforge-eagle3" / "rows_0-2000" / "data_5.ckpt"  # row 5: in shard 00001
        planted.write_bytes(planted.read_bytes()[:-100])  # a truncated file
        corrupt = checks_only(capture_asset, instance)
        assert not corrupt.success
        error = str(corrupt.get_step_failure_events()[0].step_failure_data.error)
        assert "blocking check(s) failed: ids_match_mix on 00001;" in error
        found = {(e.check_name, e.partition): e for e in corrupt.get_asset_check_evaluations()}
        assert len(found) == 15 and {k for k, e in found.items() if not e.passed} == {(verify.IDS, "00001")}
        line = found[(verify.IDS, "00001")].description
        assert line.startswith("shard 00001: 1 stored sample(s) missing, unreadable or unlike their mix row")
        assert "specforge-eagle3 row 5 unreadable" in line and "\n" not in line

        withdrawn = checks_only(capture_asset, instance)  # the failed shard lost its record, as in a capture run
        found = {(e.check_name, e.partition): e for e in withdrawn.get_asset_check_evaluations()}
        assert {k for k, e in found.items() if not e.passed} == {(name, "00001") for name in verify.CHECKS}
        line = found[(verify.IDS, "00001")].description
        assert line.startswith("shard 00001: nothing captured of the current mix and settings (capture ")
        assert line.endswith("materialize hidden_states partition 00001") and "\n" not in line
        assert withdrawn.get_asset_materialization_events() == []

        follow_the_mix(instance, 8)  # the mix shrank: training_mix dropped the last shard's partition
        shrunk = checks_only(capture_asset, instance)
        assert {e.partition for e in shrunk.get_asset_check_evaluations()} == set(SHARDS[:2])


def test_the_cli_materializes_a_capture_shard_on_the_demo_profile_with_its_checks_green(
    tmp_path: Path, demo_model: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_DATA_", "DAGSTER_"))}
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env.update(EAGLE_DATA_PROFILE="demo", EAGLE_DATA_ROOT=str(out), DAGSTER_HOME=str(home),
               EAGLE_DATA_DEMO_MODEL=str(demo_model))  # fmt: skip
    specs = list(load_catalog(profile="demo").values())
    write_mix(out, mix_frame(specs[0].name, rows=6, target="demo"))  # ids of the demo model's vocabulary
    with dg.DagsterInstance.from_config(str(home)) as instance:
        follow_the_mix(instance, 6)  # what training_mix does
    cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_data.definitions",
           "--select", layout.HIDDEN_STATES_ASSET, "--partition", "00000"]  # fmt: skip
    started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(f"dagster asset materialize hidden_states: {time.perf_counter() - started:.1f} s, {spent:.1f} CPU-s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    with dg.DagsterInstance.from_config(str(home)) as instance:
        [record] = latest_materializations(instance, KEY, ["00000"]).values()
        metadata = record.asset_materialization.metadata
        assert metadata["captured"].value is True and metadata["captured_rows"].value == 6
        files = sorted(Path(str(metadata["path"].value), "specforge-eagle3").rglob("data_*.ckpt"))
        assert [f.name for f in files] == [f"data_{row}.ckpt" for row in range(6)]
        found = latest_evaluations(instance, CHECKS, ["00000"])
        assert len(found) == len(CHECKS) and all(e.passed for e in found.values()), found
        assert {(e.judged_run_id, e.shard_sha256) for e in found.values()} == {
            (record.run_id, str(metadata[SHARD_DIGEST].value))
        }
