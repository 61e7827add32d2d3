"""Benchmark decontamination: find rows whose prompts or replies overlap benchmark items.

Two tests, on text normalized the same way on both sides (NFKC, lower case, words = runs of letters
and digits; everything else is a separator):
- exact: a whole message (a prompt turn, a reply, or a reply's reasoning) equals a benchmark item;
- n-gram: a message shares a run of `ngram` words (13 by default, the usual decontamination window)
  with a benchmark item, so a paraphrase that keeps one 13-word span is caught. Items shorter than the
  window are caught by the exact test only.

Vectorized: words are found and hashed by polars, text and n-gram hashes are rolled with numpy over a flat array of a
batch of rows, and looked up by binary search in the benchmark's sorted n-gram hashes; no Python loop
runs per word. Hashes are 64-bit and built in one process for both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import polars as pl

from eagle_data.quality.evalsets import Decontamination, load_items

SEED = 0x5EED
PRIME = np.uint64(1_099_511_628_211)  # FNV's 64-bit prime: the rolling combine of word hashes
BATCH_ROWS = 20_000
PROMPT, REPLY = "prompt", "reply"


def words(texts: pl.Series) -> pl.Series:
    """Each text's normalized words: NFKC (only texts with non-ASCII characters need it), lower case,
    runs of letters and digits."""
    texts = texts.fill_null("")
    wide = texts.str.contains(r"[^\x00-\x7F]").arg_true()
    if wide.len():
        texts = texts.scatter(wide, texts.gather(wide).str.normalize("NFKC"))
    return texts.str.to_lowercase().str.extract_all(r"[\p{L}\p{N}]+")


def _hashes(texts: pl.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hash of each whole normalized text, the word hashes of all texts end to end, each text's word count).

    Both hashes are polynomial rolls over the word hashes (wrapping at 2**64): a whole text's hash is
    its words' hashes weighted by PRIME to the power of their position, summed per text."""
    listed = words(texts)
    lengths = listed.list.len().to_numpy().astype(np.int64)
    flat = listed.explode(empty_as_null=False).hash(SEED).to_numpy()
    starts = np.cumsum(lengths) - lengths
    position = np.arange(flat.size, dtype=np.int64) - np.repeat(starts, lengths)
    powers = np.full(max(int(lengths.max(initial=0)), 1), PRIME, dtype=np.uint64)
    powers[0] = 1
    powers = np.cumprod(powers)  # PRIME ** position, wrapping
    weighted = flat * powers[position]
    whole = np.zeros(lengths.size, dtype=np.uint64)
    filled = lengths > 0
    whole[filled] = np.add.reduceat(weighted, starts[filled]) + lengths[filled].astype(np.uint64)
    return whole, flat, lengths


def _grams(flat: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n-gram hashes, the index of the text each starts in) for every window inside one text."""
    windows = flat.size - n + 1
    if windows <= 0:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    grams = flat[:windows].copy()
    for k in range(1, n):  # polynomial roll in place, wrapping at 2**64
        grams *= PRIME
        grams += flat[k : k + windows]
    owner = np.repeat(np.arange(lengths.size), lengths)
    inside = owner[:windows] == owner[n - 1 :]
    return grams[inside], owner[:windows][inside]


@dataclass(frozen=True)
class BenchmarkIndex:
    """Sorted hashes of every benchmark item's normalized text and n-grams, each with its benchmark."""

    names: tuple[str, ...]
    exact: np.ndarray
    exact_owner: np.ndarray
    grams: np.ndarray
    gram_owner: np.ndarray
    ngram: int
    items: dict[str, int]

    @classmethod
    def build(cls, items: pl.DataFrame, ngram: int = 13) -> BenchmarkIndex:
        """`items`: columns `benchmark` and `text`, one row per item text."""
        items = items.filter(words(items["text"]).list.len() > 0)
        names = tuple(sorted(set(items["benchmark"])))
        bench = items["benchmark"].replace_strict(names, range(len(names)), return_dtype=pl.Int32).to_numpy()
        whole, flat, lengths = _hashes(items["text"])
        grams, owner = _grams(flat, lengths, ngram)
        exact_order, gram_order = np.argsort(whole, kind="stable"), np.argsort(grams, kind="stable")
        return cls(
            names=names,
            exact=whole[exact_order],
            exact_owner=bench[exact_order],
            grams=grams[gram_order],
            gram_owner=bench[owner[gram_order]],
            ngram=ngram,
            items={name: int(n) for name, n in items.group_by("benchmark").len().iter_rows()},
        )

    def _lookup(self, keys: np.ndarray, table: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """For each key, the benchmark it occurs in (-1: none)."""
        if table.size == 0 or keys.size == 0:
            return np.full(keys.size, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(table, keys), table.size - 1)
        return np.where(table[at] == keys, owner[at], -1)


def message_texts(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per text unit of a conversation: `row` (position in frame), `part` (prompt | reply), `text`.
    Prompt turns are user and system messages; a reply is an assistant message's content or reasoning."""
    turns = (
        frame.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("row"), "messages")
        .explode("messages")
        .drop_nulls("messages")
        .unnest("messages")
    )
    part = pl.when(pl.col("role") == "assistant").then(pl.lit(REPLY)).otherwise(pl.lit(PROMPT))
    content = turns.select("row", part.alias("part"), pl.col("content").alias("text"))
    if "reasoning" not in turns.columns:
        return content
    reasoning = turns.filter(pl.col("role") == "assistant").select(
        "row", pl.lit(REPLY).alias("part"), pl.col("reasoning").alias("text")
    )
    return pl.concat([content, reasoning]).filter(pl.col("text").fill_null("") != "")


def scan(frame: pl.DataFrame, index: BenchmarkIndex) -> pl.DataFrame:
    """Every (row, benchmark, match, part) overlap in a frame with a `messages` column, row = position."""
    found = []
    for start in range(0, frame.height, BATCH_ROWS):
        units = message_texts(frame.slice(start, BATCH_ROWS))
        if units.is_empty():
            continue
        whole, flat, lengths = _hashes(units["text"])
        exact = index._lookup(whole, index.exact, index.exact_owner)
        grams, owner = _grams(flat, lengths, index.ngram)
        gram_hit = index._lookup(grams, index.grams, index.gram_owner)
        hits = [("exact", np.flatnonzero(exact >= 0), exact[exact >= 0])]
        hits.append(("ngram", owner[gram_hit >= 0], gram_hit[gram_hit >= 0]))
        for match, unit, bench in hits:
            if unit.size:
                found.append(
                    pl.DataFrame({"unit": unit, "bench": bench, "match": match}).with_columns(
                        row=units["row"].gather(pl.Series(unit)) + start,
                        part=units["part"].gather(pl.Series(unit)),
                    )
                )
    schema = {"row": pl.Int64, "benchmark": pl.String, "match": pl.String, "part": pl.String}
    if not found:
        return pl.DataFrame(schema=schema)
    name = pl.col("bench").replace_strict(list(range(len(index.names))), list(index.names), return_dtype=pl.String)
    return (
        pl.concat(found)
        .select("row", name.alias("benchmark"), "match", "part")
        .unique()
        .sort("row", "benchmark", "match", "part")
        .cast(schema)  # type: ignore[arg-type]
    )


def contamination(frame: pl.DataFrame, index: BenchmarkIndex) -> pl.Series:
    """Per row, the first benchmark (by name) it overlaps, else null: the `contamination` column."""
    first = scan(frame, index).group_by("row").agg(pl.col("benchmark").min())
    out = pl.DataFrame({"row": pl.int_range(frame.height, dtype=pl.Int64, eager=True)}).join(first, "row", "left")
    return out["benchmark"].alias("contamination")


@cache
def _index(settings_json: str) -> tuple[BenchmarkIndex, dict[str, str]]:
    settings = Decontamination.model_validate_json(settings_json)
    items, sources = load_items(settings)
    return BenchmarkIndex.build(items, settings.ngram), sources


def benchmark_index(settings: Decontamination) -> tuple[BenchmarkIndex, dict[str, str]]:
    """The index of every configured benchmark and where each came from; built once per process."""
    return _index(settings.model_dump_json())
