"""The training mix (or another exported file) as a local file: streamed from the store, checked against the
digest the export recorded, scanned lazily (never loaded whole)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.storage import ShardStore, StorageError
from eagle_data.storage.digests import FileDigest, check, materialize_command, read_record


@contextmanager
def exported_file(store: ShardStore, key: str) -> Iterator[tuple[Path, FileDigest]]:
    """A local path to an exported file (the mix, a trainer file) and its digest, once its bytes are those the
    export recorded (a `digests.ChangedFile` line otherwise): the file itself on a folder root, hashed once; on
    S3 a temporary download."""
    if not store.exists(key):
        raise StorageError(f"{store.uri(key)} does not exist: materialize training_mix first")
    with store.local_file(key) as path:
        found = FileDigest.of_file(path)
        record = read_record(store, layout.export_record())
        check(store.uri(key), found, record.files.get(key) if record else None, materialize_command(layout.MIX_ASSET))
        yield path, found


@contextmanager
def local_mix(store: ShardStore, key: str) -> Iterator[Path]:
    """A local path to an exported file, checked as `exported_file` checks it."""
    with exported_file(store, key) as (path, _):
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
