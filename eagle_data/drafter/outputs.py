"""The drafter outputs as plain functions over the store, called by the Dagster assets (defs/drafter.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.drafter import decontam, hidden_states, vocab
from eagle_data.drafter.mixfile import content_hash, local_mix, mix_target
from eagle_data.drafter.settings import HiddenStateRecipe
from eagle_data.quality import KEPT
from eagle_data.storage import ShardStore, digest, read_columns
from eagle_data.targets import load_target

Log = Callable[[str], None]


def write_draft_vocab(
    specs: list[DatasetSpec], store: ShardStore, sizes: tuple[int, ...], log: Log = print
) -> dict[str, Any]:
    """Count the mix's supervised tokens (once per tokenizer and mix content) and write one EAGLE-3 mapping
    per draft vocabulary size, skipping those already written; returns the figures, per size the share of
    supervised tokens the draft vocabulary covers and the file's URI."""
    with local_mix(store, layout.mix()) as path:
        target = load_target(mix_target(path, specs))
        mix_hash = content_hash(path)
        freq_key = layout.draft_vocab_file(target.tokenizer_hash, mix_hash, layout.TOKEN_FREQ_FILE)
        counted = not store.exists(freq_key)
        if counted:
            counts = vocab.count_supervised(path, target.vocab_size)
            store.write_bytes(freq_key, vocab.token_freq_bytes(counts))
        else:
            counts = vocab.counts_from_token_freq(store.read_bytes(freq_key), target.vocab_size)
    figures: dict[str, Any] = {
        "target": target.name,
        "target_vocab_size": target.vocab_size,
        "tokenizer_hash": target.tokenizer_hash,
        "mix_hash": mix_hash,
        "supervised_tokens": int(counts.sum()),
        "distinct_supervised_ids": int((counts > 0).sum()),
        "counted": counted,
        "token_freq_path": store.uri(freq_key),
    }
    for size in sizes:
        draft = vocab.draft_vocab(counts, size)
        key = layout.draft_vocab_file(target.tokenizer_hash, mix_hash, layout.vocab_mapping_name(size))
        if not store.exists(key):
            store.write_bytes(key, vocab.mapping_bytes(draft))
        figures[f"coverage_{size}"] = round(draft.coverage, 6)
        figures[f"mapping_{size}_path"] = store.uri(key)
        log(f"draft vocabulary {size}: covers {draft.coverage:.2%} of supervised tokens -> {store.uri(key)}")
    return figures


PLAN_ASSET = "hidden_state_plan"


def write_hidden_state_plan(store: ShardStore, recipe: HiddenStateRecipe) -> tuple[hidden_states.Plan, str]:
    """Size the hidden-state capture of the mix for a recipe; writes the plan as JSON and returns it with
    its markdown table."""
    with local_mix(store, layout.mix()) as path:
        sized = hidden_states.plan(hidden_states.mix_token_counts(path), recipe)
    record = {"recipe": recipe.model_dump(), **sized.figures(), "per_dataset_bytes": sized.per_dataset_bytes}
    store.write_bytes(layout.drafter_file(PLAN_ASSET, "plan.json"), json.dumps(record, indent=1).encode())
    return sized, sized.markdown(recipe)


SHOWN_IDS = 50  # prompt ids quoted in metadata (the full list would grow with the range)


@dataclass
class DecontamReport:
    """What the decontamination check found over a range of validated shards.

    `leaked` counts overlapping rows still kept for training (verdict pass or truncated): the check
    fails on any, since validation sets overlapping rows aside with the verdict `contaminated`. It also
    fails when a configured benchmark was not read (`unread`): "no overlap" with a benchmark never
    compared would be a false green.
    """

    unread: list[str] = field(default_factory=list)
    rows: int = 0
    matched: int = 0
    leaked: int = 0
    per_benchmark: dict[str, int] = field(default_factory=dict)
    per_match: dict[str, int] = field(default_factory=dict)
    matched_ids: list[str] = field(default_factory=list)
    leaked_ids: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)  # partition -> sha256 of the shard bytes scanned

    def add(self, shard: pl.DataFrame, found: pl.DataFrame) -> None:
        hits = found.join(shard.with_row_index("row").cast({"row": pl.Int64}), on="row")
        rows = hits.unique("row")
        leaked = rows.filter(pl.col("verdict").is_in(list(KEPT)))
        self.rows += shard.height
        self.matched += rows.height
        self.leaked += leaked.height
        for name, n in hits.unique(["row", "benchmark"]).group_by("benchmark").len().iter_rows():
            self.per_benchmark[name] = self.per_benchmark.get(name, 0) + n
        for kind, n in hits.unique(["row", "match"]).group_by("match").len().iter_rows():
            self.per_match[kind] = self.per_match.get(kind, 0) + n
        self.matched_ids.extend(rows["prompt_id"].head(SHOWN_IDS - len(self.matched_ids)).to_list())
        self.leaked_ids.extend(leaked["prompt_id"].head(SHOWN_IDS - len(self.leaked_ids)).to_list())

    @property
    def passed(self) -> bool:
        return self.leaked == 0 and not self.unread

    def message(self, asset: str) -> str:
        """The check's one line: what failed and what to do, or what passed."""
        if self.unread:
            return (
                f"benchmark(s) {', '.join(self.unread)} configured but not read (hub only, use_hub = false): set "
                "use_hub = true in [drafter.decontamination], or put their {name}.jsonl files in its folder, or "
                "drop them from [drafter.decontamination.benchmarks]"
            )
        if self.leaked:
            return (
                f"{self.leaked} row(s) kept for training overlap a benchmark: re-materialize {asset} to set them aside"
            )
        return f"{self.matched} of {self.rows} rows overlap a benchmark, all set aside"


def decontamination_report(
    dataset: str,
    store: ShardStore,
    partitions: Sequence[str],
    index: decontam.BenchmarkIndex,
    unread: Sequence[str] = (),
) -> DecontamReport:
    """Scan each validated shard of the range against the benchmark index, one shard in memory at a time;
    `unread` names the configured benchmarks the index lacks (evalsets.unread)."""
    report = DecontamReport(unread=list(unread))
    asset = layout.validated_asset(dataset)
    for key in partitions:
        data = store.shard_bytes(dataset, asset, key)
        shard = read_columns(data, ["prompt_id", "messages", "verdict"])  # no token lists
        report.add(shard, decontam.scan(shard, index))
        report.digests[key] = digest(data)
    return report
