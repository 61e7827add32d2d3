import errno
import os
import stat
from pathlib import Path

import boto3
import polars as pl
import pytest

from eagle_data.storage import RETRY_ENV, ShardStore, StorageError

FRAME = pl.DataFrame(
    {"prompt_id": ["a", "b"], "input_ids": [[1, 2, 3], [4]], "loss_mask": [[0, 1, 1], [1]]},
    schema={"prompt_id": pl.String, "input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8)},
)


def test_shard_round_trip_keeps_rows_and_types(store: ShardStore):
    uri = store.write_shard("b7_sharegpt", "b7_sharegpt_validated", "00001", FRAME)
    assert uri == f"{store.root}/b7_sharegpt/b7_sharegpt_validated/00001.parquet"
    back = store.read_shard("b7_sharegpt", "b7_sharegpt_validated", "00001")
    assert back.equals(FRAME) and back.schema == FRAME.schema


def test_listing_and_existence(store: ShardStore):
    for key in ("00000", "00002"):
        store.write_shard("ds", "ds_prompts", key, FRAME)
    assert store.list("ds/ds_prompts") == ["ds/ds_prompts/00000.parquet", "ds/ds_prompts/00002.parquet"]
    assert store.shard_exists("ds", "ds_prompts", "00002") and not store.shard_exists("ds", "ds_prompts", "00001")
    assert store.list("nothing/here") == []


def test_reading_a_missing_shard_says_what_to_materialize(store: ShardStore):
    with pytest.raises(StorageError, match="materialize ds_prompts partition 00007 first"):
        store.read_shard("ds", "ds_prompts", "00007")


def test_rewrite_replaces_the_shard_whole(store: ShardStore):
    store.write_shard("ds", "ds", "00000", FRAME)
    store.write_shard("ds", "ds", "00000", FRAME.head(1))
    assert store.read_shard("ds", "ds", "00000").height == 1


def test_local_write_is_atomic_when_it_fails_midway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = ShardStore(str(tmp_path))
    store.write_shard("ds", "ds", "00000", FRAME)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("eagle_data.storage.local.os.fsync", disk_full)
    with pytest.raises(StorageError, match=f"under the output root {tmp_path}: it is full"):
        store.write_shard("ds", "ds", "00000", FRAME.head(1))
    assert store.read_shard("ds", "ds", "00000").equals(FRAME)
    assert [p.name for p in (tmp_path / "ds" / "ds").iterdir()] == ["00000.parquet"]


def test_missing_bucket_is_a_one_line_error(s3_endpoint: str):
    store = ShardStore("s3://no-such-bucket/x", s3_client_factory=lambda: boto3.client("s3", endpoint_url=s3_endpoint))
    with pytest.raises(StorageError) as err:
        store.write_shard("ds", "ds", "00000", FRAME)
    message = str(err.value)
    assert "no-such-bucket" in message and "create it" in message and "\n" not in message


def test_unreachable_s3_endpoint_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(RETRY_ENV, "0.5")  # the bucket check rides out an outage as every call does
    store = ShardStore(
        "s3://bucket", s3_client_factory=lambda: boto3.client("s3", endpoint_url="http://127.0.0.1:9")
    )
    with pytest.raises(StorageError, match=r"^S3 at http://127\.0\.0\.1:9 still failing after 0\.5 s of retries "
                       r"\(EndpointConnectionError: .*\): start it or fix AWS_ENDPOINT_URL"):  # fmt: skip
        store.exists("x")


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_shards_are_written_honouring_the_process_umask(tmp_path: Path, umask: int, mode: int):
    store, old = ShardStore(str(tmp_path)), os.umask(umask)
    try:
        store.write_shard("ds", "ds", "00000", pl.DataFrame({"a": [1]}))  # readable by a colleague under 022
        store.create_exclusive("ds/ds/_lease/00000/lease.json", b"{}")
        with store.staged("ds/export/all.parquet") as path:
            path.write_bytes(b"x")
    finally:
        os.umask(old)
    for key in ("ds/ds/00000.parquet", "ds/ds/_lease/00000/lease.json", "ds/export/all.parquet"):
        assert stat.S_IMODE(Path(tmp_path, key).stat().st_mode) == mode, key
