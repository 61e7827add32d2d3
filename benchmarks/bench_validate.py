"""Validation throughput on every core against raw `tokenizers` encode_batch on every core, same texts.

Validation is the real stage (`pipeline.validate`: token ids, loss masks, verdicts, records, reports,
shards read and written); raw encodes the rendered conversations (the validated ids decoded back to
text) in one parallel `encode_batch`. `validate_vs_raw_parallel` is what bench_scale.py reports.
Usage: python benchmarks/bench_validate.py [--shards 8] [--shard-size 500] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # the raw side gets every core, as validation does

import polars as pl  # noqa: E402

from eagle_data import pipeline  # noqa: E402
from eagle_data.catalog import Adapter, DatasetSpec  # noqa: E402
from eagle_data.storage import ShardStore  # noqa: E402
from eagle_data.targets import load_target  # noqa: E402
from eagle_data_tests.fixtures_quality import generation_frame  # noqa: E402


@dataclass(frozen=True)
class Throughput:
    rows: int
    validate_rows_per_s: float
    raw_rows_per_s: float
    workers: int

    @property
    def ratio(self) -> float:
        return self.validate_rows_per_s / self.raw_rows_per_s


def validate_vs_raw_parallel(
    spec: DatasetSpec, store: ShardStore, keys: list[str], workers: int | None = None
) -> Throughput:
    """Validate `keys` (generation shards already in `store`) on `workers` processes (default every core),
    then encode the same conversations raw on every core; rows per second of each."""
    n = workers or pipeline.cores()
    start = time.perf_counter()
    pipeline.validate(spec, store, keys, workers=n)
    validate_s = time.perf_counter() - start
    tokenizer = load_target(spec.target).text_encoder
    ids = pl.concat(
        [store.read_shard(spec.name, pipeline.validated_asset(spec), key).select("input_ids") for key in keys]
    )["input_ids"].to_list()
    texts = tokenizer.decode_batch(ids, skip_special_tokens=False)
    start = time.perf_counter()
    tokenizer.encode_batch(texts, add_special_tokens=False)
    raw_s = time.perf_counter() - start
    return Throughput(len(ids), len(ids) / validate_s, len(ids) / raw_s, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-size", type=int, default=500)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    spec = DatasetSpec(
        name="bench_validate", adapter=Adapter(prompt_field="q", response_field="r"), target="qwen3-test",
        shard_size=args.shard_size, max_prompts=args.shard_size * args.shards,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        store = ShardStore(root)
        for i, key in enumerate(spec.partition_keys):
            frame = generation_frame(args.shard_size, empty_share=0.0, dataset=f"{spec.name}-{i}")
            store.write_shard(spec.name, spec.name, key, frame)
        load_target(spec.target)  # both sides start with the tokenizer loaded
        t = validate_vs_raw_parallel(spec, store, spec.partition_keys, args.workers)
    print(f"rows={t.rows} workers={t.workers} cores={pipeline.cores()}")
    print(f"validate: {t.validate_rows_per_s:,.0f} rows/s  raw encode_batch: {t.raw_rows_per_s:,.0f} rows/s")
    print(f"RESULT validate_vs_raw_parallel {t.ratio:.3f}")


if __name__ == "__main__":
    main()
