"""Bad input fails loudly, in one line, through a real Dagster instance: a source in the wrong schema, an
empty one, a truncated or 0-byte parquet file, a changed file at the same path; a non-UTF-8 JSONL line is
a counted skip; an output root that refuses writes is named with the reason."""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from eagle_data.catalog import load_catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import StorageResource
from eagle_data.storage import ShardStore, StorageError
from eagle_data.storage.shards import shards_written

SPEC = load_catalog(profile="demo")["b7_sharegpt"].model_copy(update={"max_prompts": 40})  # four shards


def materialize_prompts(root: Path, source: Path, partition: str = "00000") -> dg.ExecuteInProcessResult:
    """The prompts asset of b7_sharegpt, one partition, from `source`, in a real (ephemeral) instance."""
    prompts = next(a for a in build_dataset_assets(SPEC) if a.key == dg.AssetKey("b7_sharegpt_prompts"))
    return dg.materialize(
        [prompts],
        partition_key=partition,
        resources={**shard_resources(StorageResource(root=str(root)))},
        run_config={"ops": {"b7_sharegpt_prompts": {"config": {"source_path": str(source)}}}},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def failure(result: dg.ExecuteInProcessResult) -> str:
    """What the UI shows of a user's error: a `dg.Failure` whose description is the source's one line, with
    no Python class path and no chained traceback (the error's class is kept in its metadata)."""
    assert not result.success, "the run went green"
    (event,) = result.get_step_failure_events()
    data = event.step_failure_data
    assert data.error is not None and data.error.cause is None and data.error.context is None  # no chain
    assert data.user_failure_data is not None and data.user_failure_data.metadata["error"].value == "SourceError"
    return (data.user_failure_data.description or "").strip()


def sharegpt_rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"question {i}"}]} for i in range(start, n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_source_in_the_wrong_schema_fails_the_prompts_step_naming_expected_and_found_fields(tmp_path: Path):
    rows = [{"instruction": f"do {i}", "response": "done"} for i in range(12)]  # a Magicoder file for ShareGPT
    message = failure(materialize_prompts(tmp_path / "out", write_jsonl(tmp_path / "wrong.jsonl", rows)))
    assert "\n" not in message and not message.startswith("eagle_data.")
    assert "0 prompts from 12 rows" in message and "no_user_turn 12" in message
    assert "'conversations' (a list of turns with 'from'/'value')" in message
    assert "the rows have fields instruction, response" in message


def test_a_source_that_skips_most_rows_fails_with_the_counts_by_reason(tmp_path: Path):
    rows = sharegpt_rows(4) + [{"id": "x", "conversations": [{"role": "user", "content": "q"}]}] * 6
    message = failure(materialize_prompts(tmp_path / "out", write_jsonl(tmp_path / "mixed.jsonl", rows)))
    assert "4 prompts from 10 rows" in message and "6 skipped: unknown_role 6" in message
    assert "max_skipped_share 0.5" in message and "its turns have keys content, from, role, value" in message


def test_an_empty_source_file_fails_the_prompts_step(tmp_path: Path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    message = failure(materialize_prompts(tmp_path / "out", empty))
    assert f"source {empty} has no rows" in message


def test_a_changed_source_file_at_the_same_path_is_read_again(tmp_path: Path):
    source = write_jsonl(tmp_path / "src.jsonl", sharegpt_rows(12))
    assert materialize_prompts(tmp_path / "out", source).success
    write_jsonl(source, sharegpt_rows(112, start=100))
    result = materialize_prompts(tmp_path / "out", source)
    assert result.success
    shard = ShardStore(str(tmp_path / "out")).read_shard("b7_sharegpt", "b7_sharegpt_prompts", "00000")
    assert shard["source_id"].to_list() == [f"r{i}" for i in range(100, 110)]


def test_a_partition_past_the_sources_prompts_fails_instead_of_going_green_empty(tmp_path: Path):
    source = write_jsonl(tmp_path / "src.jsonl", sharegpt_rows(25))  # fills partitions 00000-00002 (10 a shard)
    assert materialize_prompts(tmp_path / "out", source, partition="00002").success
    message = failure(materialize_prompts(tmp_path / "out", source, partition="00003"))
    assert "yields 25 prompts, which fill partitions 00000-00002" in message
    assert "set max_prompts to 25 for b7_sharegpt" in message and "\n" not in message
    assert shards_written(ShardStore(str(tmp_path / "out")), "b7_sharegpt", "b7_sharegpt_prompts") == ["00002"]


@pytest.mark.parametrize("cut", ["truncated", "empty"])
def test_a_broken_parquet_source_is_named_in_one_line(tmp_path: Path, cut: str):
    path = tmp_path / "src.parquet"
    rows = sharegpt_rows(500)
    pl.DataFrame({"id": [r["id"] for r in rows], "conversations": [r["conversations"] for r in rows]}).write_parquet(
        path
    )
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if cut == "truncated" else b"")
    message = failure(materialize_prompts(tmp_path / "out", path))
    assert f"{path} ({path.stat().st_size} bytes) is not a complete parquet file" in message
    assert "\n" not in message and not message.startswith("eagle_data.")


def test_a_non_utf8_jsonl_line_is_a_counted_skip_and_the_rest_is_kept(tmp_path: Path):
    path = tmp_path / "src.jsonl"
    lines = [json.dumps(r).encode() for r in sharegpt_rows(10)]
    lines.insert(3, b'{"id": "bad", "conversations": [{"from": "human", "value": "caf\xe9"}]}')
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = materialize_prompts(tmp_path / "out", path)
    assert result.success
    metadata = result.asset_materializations_for_node("b7_sharegpt_prompts")[0].metadata
    assert metadata["skipped_bad_encoding"].value == 1 and metadata["prompts_in_source"].value == 10


def _write_unprivileged(root: Path) -> tuple[str, bool]:
    """Write one key under `root` in a forked child, as an unprivileged user when the tests run as root
    (root ignores permission bits); returns the error message and whether it stands alone (no chain)."""
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def child() -> None:
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        try:
            ShardStore(str(root)).write_bytes("ds/ds/00000.json", b"x")
            answers.put(("written", False))
        except StorageError as exc:
            answers.put((str(exc), exc.__cause__ is None and exc.__suppress_context__))

    process = context.Process(target=child)
    process.start()
    try:
        return answers.get(timeout=60)
    finally:
        process.join(10)


def test_a_read_only_output_root_is_named_with_the_reason_and_no_chained_errors():
    base = Path(tempfile.mkdtemp(prefix="eagle-ro-"))  # not under pytest's root-only tmp folder
    try:
        base.chmod(0o555)
        message, alone = _write_unprivileged(base / "out")
    finally:
        base.chmod(0o755)
        base.rmdir()
    assert message.startswith(f"cannot write ds/ds/00000.json under the output root {base}/out: it is not writable")
    assert "(permission denied)" in message and "EAGLE_DATA_ROOT" in message and "\n" not in message
    assert alone

