"""The training mix as a local file: streamed from the store, hashed, scanned lazily (never loaded whole)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from eagle_data.catalog import DatasetSpec
from eagle_data.storage import ShardStore, StorageError


@contextmanager
def local_mix(store: ShardStore, key: str) -> Iterator[Path]:
    """A local path to the mix: the file itself on a folder root, a temporary download on S3."""
    if not store.exists(key):
        raise StorageError(f"{store.uri(key)} does not exist: materialize training_mix first")
    with store.local_file(key) as path:
        yield path


def mix_target(path: Path, specs: list[DatasetSpec]) -> str:
    """The one target model every dataset in the mix was tokenized for (ids of two targets never mix): the
    rows' own `target` (what validation resolved, `target = "auto"` included), else the catalog's."""
    scan = pl.scan_parquet(path)
    made_for = pl.DataFrame({"target": []}, schema={"target": pl.String})
    if "target" in scan.collect_schema().names():  # a mix written before rows named their target has none
        made_for = scan.select(pl.col("target").drop_nulls().unique()).collect(engine="streaming")
    if made_for.height > 1:
        raise ValueError(f"the mix holds rows of {made_for.height} targets ({', '.join(sorted(made_for['target']))}); "
                         "give every dataset in the mix the same target")  # fmt: skip
    if made_for.height == 1:
        return str(made_for["target"][0])
    names = pl.scan_parquet(path).select(pl.col("dataset").unique()).collect(engine="streaming")["dataset"]
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise ValueError(f"the mix holds dataset(s) {', '.join(unknown)} missing from the catalog; re-export it")
    targets = sorted({by_name[name].target for name in names})
    if len(targets) != 1:
        raise ValueError(
            f"the mix holds datasets of {len(targets)} targets ({', '.join(targets) or 'none'}); "
            "give every dataset in the mix the same catalog `target`"
        )
    return targets[0]
