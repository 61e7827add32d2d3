"""The shard IO manager rides out an S3 outage inside EAGLE_DATA_STORAGE_RETRY_S (issue 43, item 5): its first
call on a fresh store (the bucket check) is retried like every other. The link to moto's server is cut through
the tests' CutProxy as the asset hands its shard to `handle_output`."""

from __future__ import annotations

import time

import dagster as dg
import polars as pl
import pytest

from eagle_data.defs.io_managers import DATASET_TAG, SHARD_IO, shard_resources
from eagle_data.defs.resources import S3ClientResource, StorageResource
from eagle_data.standins.cut_proxy import CutProxy
from eagle_data.storage import RETRY_ENV
from eagle_data_tests.conftest import store_behind

DS = "b7_sharegpt"
CUT_S = 10.0
FRAME = pl.DataFrame({"prompt_id": ["a", "b"], "n": [1, 2]})


def test_a_cut_while_the_io_manager_stores_a_shard_is_ridden_out(
    s3_proxy: CutProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRY_ENV, "20")
    s3 = S3ClientResource(endpoint_url=f"http://127.0.0.1:{s3_proxy.port}", max_attempts=1)  # no botocore retries
    storage = StorageResource(root=f"s3://{s3_bucket}/out", s3=s3)

    @dg.asset(name=f"{DS}_prompts", partitions_def=dg.StaticPartitionsDefinition(["00000"]), io_manager_key=SHARD_IO,
              tags={DATASET_TAG: DS})  # fmt: skip
    def shards() -> dict[str, pl.DataFrame]:
        s3_proxy.cut(CUT_S)  # S3 goes away as the IO manager takes the output: its first call meets the outage
        return {"00000": FRAME}

    started = time.monotonic()
    result = dg.materialize([shards], partition_key="00000", resources=shard_resources(storage), raise_on_error=False)
    took = time.monotonic() - started
    failures = [e.step_failure_data.user_failure_data for e in result.all_events if e.is_step_failure]
    assert result.success, failures
    assert took >= CUT_S - 1, f"the run took {took:.1f} s: the outage was not met"
    assert store_behind(s3_proxy, s3_bucket).read_shard(DS, f"{DS}_prompts", "00000").equals(FRAME)
