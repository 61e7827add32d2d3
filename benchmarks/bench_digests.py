"""What checking digests on every read costs: a stage reading its input shards with the digest check
(`storage.shards.StoredShards`: the bytes read once, hashed in memory, compared with the shard's digest record,
then parsed) against the same reads without it (`ShardStore.read_shard`), measured in the same run.

Synthetic validated-like shards (token lists of 200-2,000 ids, a reply text) on a local folder, written by the
shard writer the IO manager uses (which records their digests); each pass reads every shard once, best of
`--repeats` passes.

    python benchmarks/bench_digests.py [--shards 20] [--rows 500] [--repeats 3]
Last line: `RESULT digest_read_overhead <checked seconds / plain seconds>`: one sha256 pass over bytes already in
memory against reading and decoding them (1.16 and 1.41 in two runs at load 10-16 on 2 cores: sha256 runs at about
0.5 GB/s there); validation's own work on a shard (tokenizing every row) is orders of magnitude larger.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import polars as pl

from eagle_data import layout
from eagle_data.storage import ShardStore
from eagle_data.storage.shards import StoredShards, write_shards

DATASET = "b9_bench"


def shard(rows: int, seed: int) -> pl.DataFrame:
    rng = random.Random(seed)
    ids = [[rng.randrange(151_000) for _ in range(rng.randint(200, 2_000))] for _ in range(rows)]
    return pl.DataFrame(
        {"prompt_id": [f"{seed}-{i}" for i in range(rows)], "input_ids": ids,
         "content": [" ".join(map(str, row[:300])) for row in ids]},
        schema_overrides={"input_ids": pl.List(pl.Int32)},
    )  # fmt: skip


def best(passes: int, read_all: object) -> float:
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        read_all()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-digests-") as root:
        store, asset = ShardStore(root), layout.generation_asset(DATASET)
        keys = [f"{i:05d}" for i in range(args.shards)]
        stored = write_shards(store, DATASET, asset, {key: shard(args.rows, i) for i, key in enumerate(keys)})
        megabytes = sum(s.digest.size for s in stored.values()) / 1e6
        checked = StoredShards(store, DATASET, asset, keys)
        plain_s = best(args.repeats, lambda: [store.read_shard(DATASET, asset, key) for key in keys])
        checked_s = best(args.repeats, lambda: [checked[key] for key in keys])
    print(f"{args.shards} shards, {megabytes:.1f} MB: plain {plain_s:.3f} s, checked {checked_s:.3f} s "
          f"({megabytes / checked_s:.0f} MB/s checked)")  # fmt: skip
    print(f"RESULT digest_read_overhead {checked_s / plain_s:.3f}")


if __name__ == "__main__":
    main()
