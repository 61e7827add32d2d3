import json
import os
from pathlib import Path

import boto3
import polars as pl
import pytest

from eagle_data.catalog import DatasetSpec, load_catalog
from eagle_data.sources import (
    PROMPTS_SCHEMA,
    BadRow,
    PromptIndex,
    SourceError,
    load_index,
    normalize,
    prompt_id,
)
from eagle_data.storage import ShardStore

SAMPLE_ROWS = 40  # each bundled sample file's rows, bad ones included: these tests read all of them
SPECS = {name: s.model_copy(update={"max_prompts": SAMPLE_ROWS}) for name, s in load_catalog(profile="demo").items()}


def index_of(spec: DatasetSpec, root: Path, source: Path | None = None) -> PromptIndex:
    """Build (or load) `spec`'s prompt index under a fresh output root, from `source` when given."""
    return load_index(spec, ShardStore(str(root)), str(source) if source else None)


def everything(index: PromptIndex) -> pl.DataFrame:
    """Every prompt of an index in one frame (fine for test-sized sources)."""
    return pl.concat(index.blocks())


@pytest.mark.parametrize("name", list(SPECS))
def test_every_adapter_reads_its_sample(name: str, tmp_path: Path):
    spec = SPECS[name]
    index = index_of(spec, tmp_path)
    assert everything(index).height == 36
    assert sum(index.skipped.values()) == index.rows_read - 36 >= 4
    roles = {m["role"] for msgs in everything(index)["messages"].to_list() for m in msgs}
    assert roles <= {"system", "user", "assistant"} and "user" in roles
    for msgs in everything(index)["messages"].to_list():
        first = 1 if msgs[0]["role"] == "system" else 0
        assert msgs[first]["role"] == "user"


def test_sharegpt_roles_map_to_user_and_assistant():
    row = {
        "conversations": [
            {"from": "system", "value": "s"},
            {"from": "human", "value": "q"},
            {"from": "bing", "value": "a"},
            {"from": "human", "value": "q2"},
            {"from": "bard", "value": "a2"},
            {"from": "chatgpt", "value": "a3"},
        ]
    }
    msgs = normalize(row, SPECS["b7_sharegpt"].adapter, 1000)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "assistant"]


def test_instruction_response_pairs_become_two_turns():
    msgs = normalize({"instruction": "do it", "response": "done"}, SPECS["b3_magicoder"].adapter, 1000)
    assert msgs == [{"role": "user", "content": "do it"}, {"role": "assistant", "content": "done"}]


def test_system_column_is_prepended():
    row = {"system": "be terse", "conversations": [{"from": "user", "value": "hi"}]}
    assert normalize(row, SPECS["b5_openthoughts"].adapter, 1000)[0] == {"role": "system", "content": "be terse"}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"conversations": [{"from": "human", "value": ""}]}, "empty_content"),
        ({"conversations": [{"from": "human", "value": "  \n"}]}, "empty_content"),
        ({"conversations": [{"from": "human", "value": 7}]}, "non_string_content"),
        ({"conversations": [{"from": "human", "value": None}]}, "non_string_content"),
        ({"conversations": [{"from": "gpt", "value": "only me"}]}, "no_user_turn"),
        ({"conversations": []}, "no_user_turn"),
        ({"conversations": "not a list"}, "no_user_turn"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "robot", "value": "a"}]}, "unknown_role"),
        ({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]}, "bad_turn_order"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "system", "value": "s"}]}, "bad_turn_order"),
        ({"conversations": [{"from": "human", "value": "x" * 101}]}, "prompt_too_long"),
    ],
)
def test_bad_rows_are_classified(row: dict, reason: str):
    with pytest.raises(BadRow) as bad:
        normalize(row, SPECS["b7_sharegpt"].adapter, 100)
    assert bad.value.reason == reason


def test_prompt_id_is_stable_and_content_addressed():
    msgs = [{"role": "user", "content": "hello"}]
    assert prompt_id("b7_sharegpt", msgs) == prompt_id("b7_sharegpt", [dict(m) for m in msgs])
    assert prompt_id("b7_sharegpt", msgs) != prompt_id("b6_ultrachat", msgs)
    assert prompt_id("b7_sharegpt", msgs) != prompt_id("b7_sharegpt", [{"role": "user", "content": "hello!"}])


def test_duplicates_and_malformed_lines_are_counted_not_fatal(tmp_path: Path):
    path = tmp_path / "src.jsonl"
    good = {"id": "a", "conversations": [{"from": "human", "value": "hi"}]}
    path.write_text("\n".join([json.dumps(good), json.dumps(good), "{not json", "[1, 2]", ""]) + "\n")
    index = index_of(SPECS["b7_sharegpt"].model_copy(update={"max_skipped_share": 1.0}), tmp_path / "out", path)
    assert everything(index).height == 1
    assert index.skipped == {"duplicate": 1, "malformed_row": 2}


def test_local_parquet_source(tmp_path: Path):
    path = tmp_path / "src.parquet"
    pl.DataFrame({"instruction": ["a", "b", "a"], "response": ["1", "2", "1"]}).write_parquet(path)
    index = index_of(SPECS["b3_magicoder"], tmp_path / "out", path)
    assert everything(index).height == 2 and index.skipped == {"duplicate": 1}


def test_missing_source_file_is_a_one_line_error(tmp_path: Path):
    with pytest.raises(SourceError) as err:
        index_of(SPECS["b7_sharegpt"], tmp_path / "out", tmp_path / "nope.jsonl")
    assert "b7_sharegpt" in str(err.value) and "nope.jsonl" in str(err.value) and "\n" not in str(err.value)


def test_shards_slice_the_index_in_order(tmp_path: Path):
    spec = SPECS["b7_sharegpt"]
    index = load_index(spec, ShardStore(str(tmp_path)))
    shards = [index.shard(spec, key) for key in spec.partition_keys]
    assert [s.height for s in shards] == [10, 10, 10, 6]
    assert pl.concat(shards)["prompt_id"].to_list() == everything(index)["prompt_id"].to_list()
    assert dict(shards[1].schema) == PROMPTS_SCHEMA and set(shards[1]["shard"]) == {1}


def test_saved_index_is_reused_while_the_source_content_is_unchanged(tmp_path: Path):
    """Same bytes (even re-written, with a new mtime) -> the saved index, not a rebuild."""
    source = tmp_path / "src.jsonl"
    source.write_text(SPECS["b7_sharegpt"].sample_path.read_text())
    spec, store = SPECS["b7_sharegpt"].model_copy(update={"source": str(source)}), ShardStore(str(tmp_path / "out"))
    first = load_index(spec, store)
    source.write_text(source.read_text())
    os.utime(source, ns=(1, 1))
    again = load_index(spec, store)
    assert again.summary.digest == first.summary.digest and not again.rebuilt
    assert (
        everything(again).equals(everything(first))
        and again.skipped == first.skipped
        and everything(first).height == 36
    )


def test_a_saved_index_stands_when_its_source_file_is_gone(tmp_path: Path):
    """Another machine on the same root, or a download deleted after indexing: the shards still come."""
    source = tmp_path / "src.jsonl"
    source.write_text(SPECS["b7_sharegpt"].sample_path.read_text())
    spec, store = SPECS["b7_sharegpt"].model_copy(update={"source": str(source)}), ShardStore(str(tmp_path / "out"))
    first = everything(load_index(spec, store))
    source.unlink()
    assert load_index(spec, store).shard(spec, "00001")["prompt_id"].to_list() == first["prompt_id"].to_list()[10:20]


def test_a_changed_source_file_rebuilds_the_index(tmp_path: Path):
    source = tmp_path / "src.jsonl"
    source.write_text(SPECS["b7_sharegpt"].sample_path.read_text())
    spec, store = SPECS["b7_sharegpt"].model_copy(update={"source": str(source)}), ShardStore(str(tmp_path / "out"))
    first = load_index(spec, store)
    source.write_text('{"id": "new", "conversations": [{"from": "human", "value": "a new first prompt"}]}\n')
    again = load_index(spec, store)
    assert everything(again)["messages"].to_list() == [[{"role": "user", "content": "a new first prompt"}]]
    assert first.prompts == 36 and "changed since its prompt index was built" in again.rebuilt
    blocks = [k for k in store.list("b7_sharegpt") if "/_index/" in k and k.endswith(".parquet")]
    assert blocks and all(again.summary.digest in k for k in blocks)  # the old build's blocks are gone


@pytest.mark.parametrize(
    ("change", "named"),
    [({"source": "elsewhere.jsonl"}, "source"), ({"max_prompts": 20}, "max_prompts"),
     ({"max_prompt_chars": 50}, "max_prompt_chars")],
)  # fmt: skip
def test_saved_index_built_under_other_settings_is_refused(tmp_path: Path, change: dict, named: str):
    spec, store = SPECS["b7_sharegpt"], ShardStore(str(tmp_path))
    load_index(spec, store)
    with pytest.raises(SourceError, match=rf"other {named}; use another EAGLE_DATA_ROOT, or delete") as err:
        load_index(spec.model_copy(update=change), store)
    assert "\n" not in str(err.value)


def test_an_s3_source_is_keyed_by_its_etag(tmp_path: Path, s3_endpoint: str, s3_bucket: str):
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    store = ShardStore(f"s3://{s3_bucket}/out", s3_client_factory=lambda: client)
    spec = SPECS["b7_sharegpt"].model_copy(update={"source": f"s3://{s3_bucket}/in/src.jsonl"})
    client.put_object(Bucket=s3_bucket, Key="in/src.jsonl", Body=SPECS["b7_sharegpt"].sample_path.read_bytes())
    first = load_index(spec, store)
    assert first.prompts == 36 and load_index(spec, store).summary.digest == first.summary.digest
    changed = b'{"conversations": [{"from": "human", "value": "q"}]}'
    client.put_object(Bucket=s3_bucket, Key="in/src.jsonl", Body=changed)
    again = load_index(spec, store)
    assert again.prompts == 1 and "etag" in again.rebuilt


def test_a_one_shard_run_reads_only_its_own_block_of_the_index(tmp_path: Path):
    """The index is saved in blocks of shard_size prompts: with every other block gone, shard 2 still reads."""
    spec, store = SPECS["b7_sharegpt"], ShardStore(str(tmp_path))
    whole = everything(load_index(spec, store))
    blocks = [k for k in store.list("b7_sharegpt") if "/_index/" in k and k.endswith(".parquet")]
    assert len(blocks) == 4
    for key in blocks:
        if not key.endswith("00002.parquet"):
            store.delete(key)
    shard = load_index(spec, store).shard(spec, "00002")
    assert shard["prompt_id"].to_list() == whole["prompt_id"].to_list()[20:30]


def test_a_smaller_shard_size_cuts_the_same_prompts_across_blocks(tmp_path: Path):
    """Blocks follow the shard size the index was built with; another shard size slices across them."""
    store = ShardStore(str(tmp_path))
    whole = everything(load_index(SPECS["b7_sharegpt"], store))
    spec = SPECS["b7_sharegpt"].model_copy(update={"shard_size": 7})
    shards = [load_index(spec, store).shard(spec, key) for key in spec.partition_keys]
    assert [s.height for s in shards] == [7, 7, 7, 7, 7, 1]
    assert pl.concat(shards)["prompt_id"].to_list() == whole["prompt_id"].to_list()


def test_a_same_size_edit_with_its_mtime_restored_rebuilds_the_index(tmp_path: Path):
    source = tmp_path / "src.jsonl"
    source.write_text(SPECS["b7_sharegpt"].sample_path.read_text())
    spec, store = SPECS["b7_sharegpt"].model_copy(update={"source": str(source)}), ShardStore(str(tmp_path / "out"))
    first = load_index(spec, store)
    before = source.stat()
    edited = source.read_text().replace("a", "b", 1)  # same size, other content
    source.write_text(edited)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back, as `touch -d` or `cp -p` do
    assert source.stat().st_size == before.st_size and source.stat().st_mtime_ns == before.st_mtime_ns
    again = load_index(spec, store)
    assert "changed since its prompt index was built" in again.rebuilt
    assert again.summary.digest != first.summary.digest
