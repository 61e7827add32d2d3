"""The export: per dataset, the chosen trainer files and tokenized parquet of the admitted validated shards;
then the weighted training mix across datasets, and its trainer files."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data import exports, layout
from eagle_data.catalog import DatasetSpec
from eagle_data.exports.formats import DEFAULT_FORMATS, chosen
from eagle_data.report import Log
from eagle_data.storage import CorruptFile, ShardStore
from eagle_data.storage.digests import ChangedFile, FileDigest, check, materialize_command, write_record

LeftOut = tuple[str, str, str]  # (dataset, partition, reason) of a shard the export does not read
EXCLUDED_SHOWN = 200  # excluded shards listed in the export's metadata table; the log lists every one



def export_keys(spec: DatasetSpec, formats: Sequence[str] = DEFAULT_FORMATS) -> dict[str, str]:
    """Storage keys of a dataset's export files: each chosen trainer format's (by name), and "train"."""
    files = {f.name: layout.export_file(spec.name, f.file) for f in chosen(formats)}
    return {**files, "train": layout.export_file(spec.name, layout.TRAIN_FILE)}


def mix_keys(formats: Sequence[str] = DEFAULT_FORMATS) -> dict[str, str]:
    """Storage keys of the mix's trainer files (the chosen formats written for the whole mix), by name."""
    return {f.name: layout.mix_file(f.file) for f in chosen(formats) if f.mix}


def export(
    specs: list[DatasetSpec],
    store: ShardStore,
    admissions: Mapping[str, exports.Admission],
    *,
    seed: int,
    log: Log = print,
    bucket_rows: int | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> dict[str, Any]:
    """Per dataset, the chosen trainer files (`formats`, exports.formats) and tokenized parquet of the
    admitted shards' training rows; then the weighted training mix across datasets, and its trainer files.
    Streams: one shard, or one bucket of mix rows (`bucket_rows`, default sized from the rows' tokens), in
    memory at a time.

    A dataset with no admitted shard is left out and its old export files are removed (they may hold
    rows of shards that have since failed a check). Nothing to take at all is an ExportError, and then
    the old mix is removed too. All files are replaced only once the whole export has succeeded; then the
    export record (`layout.export_record`) holds the sha256 and size of each, which every later reader checks."""
    figures: dict[str, Any] = {}
    excluded = [(spec.name, key, reason) for spec in specs
                for key, reason in sorted(admissions.get(spec.name, exports.Admission()).excluded.items())]  # fmt: skip
    warn_left_out(excluded, log)
    staged_files: dict[str, Path] = {}  # storage key -> the local file that replaces it on success
    with tempfile.TemporaryDirectory(prefix="eagle-export-") as spill, ExitStack() as staged:

        def stage(key: str) -> Path:
            staged_files[key] = staged.enter_context(store.staged(key))
            return staged_files[key]

        trains: dict[str, Path] = {}
        written: dict[str, exports.Written] = {}
        for spec in specs:
            admission = admissions.get(spec.name, exports.Admission())
            keys = export_keys(spec, formats)
            if not admission.admitted:
                for key in keys.values():
                    store.delete(key)
                continue
            files = {name: stage(key) for name, key in keys.items()}
            trains[spec.name] = files.pop("train")
            written[spec.name], changed = dataset_files(spec, store, admission, files, trains[spec.name], figures, log)
            excluded += changed
        figures["excluded_shards"] = len(excluded)
        if excluded:
            figures["excluded"] = excluded_table(excluded)
        if not sum(done.rows for done in written.values()):
            for key in (layout.mix(), *mix_keys(formats).values(), layout.export_record()):
                store.delete(key)
            read = {name: done for name, done in written.items() if figures[f"{name}_shards"]}
            raise exports.ExportError(nothing_to_take(read, excluded))
        weights = {spec.name: spec.mix_weight for spec in specs}
        mixed = mix_files(written, trains, weights, stage, Path(spill), seed, bucket_rows, formats)
        figures["mix_rows"] = mixed
        digests = {key: FileDigest.of_file(path) for key, path in staged_files.items()}  # local files, just written
    write_record(store, layout.export_record(), digests)
    figures["mix_path"] = store.uri(layout.mix())
    figures.update({f"mix_{name}_path": store.uri(key) for name, key in mix_keys(formats).items()})
    return figures


def dataset_files(
    spec: DatasetSpec,
    store: ShardStore,
    admission: exports.Admission,
    files: dict[str, Path],
    train: Path,
    figures: dict[str, Any],
    log: Log,
) -> tuple[exports.Written, list[LeftOut]]:
    """Write one dataset's trainer `files` and tokenized parquet (`train`) from its admitted shards, adding its
    figures; returns what was written and the admitted shards left out on the way (see admitted_shards)."""
    changed: list[LeftOut] = []
    done = exports.write_dataset(admitted_shards(spec, store, admission, changed), spec, files, train)
    warn_left_out(changed, log)
    figures.update({f"{spec.name}_rows": done.rows, f"{spec.name}_shards": len(admission.admitted) - len(changed)})
    figures.update({f"{spec.name}_refused_{reason}": n for reason, n in sorted(done.dropped.items())})
    if done.dropped:
        log(f"WARNING {spec.name}: {sum(done.dropped.values())} rows kept at validation were refused "
            f"on the way out ({dict(done.dropped)}); re-validate those shards")  # fmt: skip
    return done, changed


def mix_files(
    written: Mapping[str, exports.Written],
    trains: Mapping[str, Path],
    weights: Mapping[str, float],
    stage: Callable[[str], Path],
    spill: Path,
    seed: int,
    bucket_rows: int | None,
    formats: Sequence[str],
) -> int:
    """Write the weighted mix of the datasets' training rows (`trains`) and its trainer files, each to the local
    file `stage(key)` gives, `bucket_rows` rows in memory at a time (default sized from the rows' tokens);
    returns its rows."""
    plan = exports.plan_mix({name: done.rows for name, done in written.items()}, weights, seed)
    rows = sum(done.rows for done in written.values())
    size = bucket_rows or exports.bucket_rows(rows, sum(done.tokens for done in written.values()))
    mix_file = stage(layout.mix())
    mixed_rows = exports.write_mix(trains, plan, mix_file, spill, size)
    mixed = {name: stage(key) for name, key in mix_keys(formats).items()}
    exports.write_mix_files(mix_file, mixed, size)
    return mixed_rows


def warn_left_out(left_out: list[LeftOut], log: Log) -> None:
    """One warning line per shard left out: the log names every one, the metadata table only the first."""
    for name, key, reason in left_out:
        log(f"WARNING {name} shard {key} left out of the export: {reason}")


def admitted_shards(
    spec: DatasetSpec, store: ShardStore, admission: exports.Admission, changed: list[LeftOut]
) -> Iterator[pl.DataFrame]:
    """The admitted validated shards of `spec`, in order, each read when reached and hashed as read; a shard
    whose bytes are not the ones its checks judged is skipped and noted in `changed` as (dataset, partition,
    reason): what changed and the command that makes it again (a torn or garbled one: the command that moves
    it aside)."""
    asset = layout.validated_asset(spec.name)
    for key in admission.admitted:
        data = store.shard_bytes(spec.name, asset, key)
        uri = store.uri(store.shard_key(spec.name, asset, key))
        try:  # a torn file first: its digest differs too, but "unreadable" (and its `mv`) is what helps
            frame = store.parse_shard(spec.name, asset, key, data)
            check(uri, FileDigest.of(data), admission.digests.get(key), materialize_command(asset, key))
        except ChangedFile as exc:
            changed.append((spec.name, key, f"its bytes changed since its checks ran {exc.figures} (a validation "
                            f"run that stopped part-way, or an edit); make it again with `{exc.repair}`"))  # fmt: skip
            continue
        except CorruptFile as exc:
            changed.append((spec.name, key, str(exc)))
            continue
        yield frame


def nothing_to_take(written: Mapping[str, exports.Written], excluded: list[LeftOut]) -> str:
    """The one line of an export with no row to write."""
    if written:
        return (f"training_mix: the admitted shards of {', '.join(sorted(written))} hold no row fit for training "
                "(see the refused counts in the log); fix the data and re-validate")  # fmt: skip
    if excluded:
        name, key, reason = excluded[0]
        return (f"training_mix: no validated shard passed every blocking check ({len(excluded)} left out, "
                f"e.g. {name} {key}: {reason}); fix the data or re-run the checks, then export again")  # fmt: skip
    return "training_mix: no validated shard yet; materialize {ds}_validated first"


def excluded_table(excluded: list[LeftOut]) -> str:
    """Markdown table of the shards left out, the first EXCLUDED_SHOWN of them."""
    lines = ["| dataset | shard | reason |", "| --- | --- | --- |"]
    lines += [f"| {name} | {key} | {reason.replace('|', '/')} |" for name, key, reason in excluded[:EXCLUDED_SHOWN]]
    if len(excluded) > EXCLUDED_SHOWN:
        lines.append(f"| … | … | {len(excluded) - EXCLUDED_SHOWN} more in the run log |")
    return "\n".join(lines)
