"""The drafter outputs as plain functions over the store, called by the Dagster assets (defs/drafter.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.drafter import capture, decontam, hidden_states, layers, trainers, verify, vocab
from eagle_data.drafter.mixfile import content_hash, local_mix, mix_target
from eagle_data.drafter.settings import CaptureSettings, HiddenStateRecipe
from eagle_data.quality import KEPT
from eagle_data.storage import ShardStore, digest, read_columns
from eagle_data.targets import load_target

Log = Callable[[str], None]


def write_draft_vocab(
    specs: list[DatasetSpec],
    store: ShardStore,
    sizes: tuple[int, ...],
    log: Log = print,
    formats: tuple[str, ...] = ("specforge-eagle3",),
) -> dict[str, Any]:
    """Count the mix's supervised tokens (once per tokenizer and mix content) and write one EAGLE-3 mapping
    per draft vocabulary size, in the files the chosen trainers (`formats`) load, skipping those already
    written; returns the figures, per size the share of supervised tokens the draft vocabulary covers and
    the SpecForge file's URI (the others lie beside it)."""
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
        names = trainers.vocab_names(formats, size)
        keys = {name: layout.draft_vocab_file(target.tokenizer_hash, mix_hash, name) for name in names}
        missing = [name for name, key in keys.items() if not store.exists(key)]
        for name, data in vocab.mapping_files(draft, missing).items():
            store.write_bytes(keys[name], data)
        figures[f"coverage_{size}"] = round(draft.coverage, 6)
        figures[f"mapping_{size}_path"] = store.uri(keys[layout.vocab_mapping_name(size)])
        log(f"draft vocabulary {size}: covers {draft.coverage:.2%} of supervised tokens -> {', '.join(keys)}")
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


@dataclass
class CapturedShard:
    """One capture shard in a run: its own figures and what verification found in it."""

    figures: dict[str, Any]
    found: verify.Findings


def write_hidden_states(
    specs: list[DatasetSpec],
    store: ShardStore,
    partitions: Sequence[str],
    settings: CaptureSettings,
    checkpoint: str,
    device: str,
    log: Log = print,
) -> tuple[dict[str, Any], dict[str, CapturedShard]]:
    """Capture (or skip, when unchanged) and verify the hidden states of the mix's capture shards
    `partitions`; returns the capture's figures (the same for every shard: provenance, layers, path) and
    each shard's own. A shard that fails verification loses its record, so the next run captures it again.
    Refuses, before loading the model, a shard past the end of the mix."""
    with local_mix(store, layout.mix()) as path:
        total = pl.scan_parquet(path).select(pl.len()).collect().item()
        filled = -(-total // settings.shard_rows)
        past = [p for p in partitions if int(p) >= filled]
        if past:
            raise capture.CaptureError(
                f"capture shard(s) {', '.join(past[:3])} start past the mix's {total:,} rows: materialize shards "
                f"00000...{filled - 1:05d} only ({settings.shard_rows:,} rows each; [drafter.capture] max_rows sets "
                "how many partitions exist)"
            )
        target = load_target(mix_target(path, specs))
        folder = capture.checkpoint_folder(checkpoint)
        backend = capture.TransformersBackend(folder, device, capture.resolve_dtype(settings.dtype, device))
        plan = layers.resolve(settings, backend.num_layers)
        base = {
            "checkpoint": str(folder),
            "checkpoint_sha256": capture.checkpoint_hash(folder),
            "num_layers": backend.num_layers,
            "hidden_size": backend.hidden_size,
            "layers": plan.record(),
            "dtype": backend.dtype,
            "fp8": settings.fp8,
            "target": target.name,
            "tokenizer_hash": target.tokenizer_hash,
            "formats": list(settings.formats),
        }
        cid = capture.capture_id(base)
        log(f"hidden states: capture {cid}, {plan.record()}, {backend.dtype} on {device}, {total:,} mix rows")
        shards: dict[str, CapturedShard] = {}
        for partition in partitions:
            frame = capture.shard_frame(path, int(partition), settings.shard_rows)
            top = frame.select(pl.col("input_ids").list.max().max()).item()
            if top is not None and top >= backend.vocab_size:
                raise capture.CaptureError(
                    f"mix row in shard {partition} holds token id {top}, past the checkpoint's vocabulary of "
                    f"{backend.vocab_size}: the checkpoint {folder} is not the mix's target {target.name}"
                )
            rows = frame["row"]
            provenance = {
                **base,
                "mix_shard_sha256": capture.shard_hash(frame),
                "mix_rows": [rows.min(), rows.max() + 1],
            }
            result = capture.capture_shard(store, cid, partition, frame, provenance, backend, plan, settings, log)
            record = result.record
            found = verify.verify_shard(
                store, layout.capture_dir(cid), record, frame, plan, backend, settings.recapture_rows, settings.seed
            )
            shards[partition] = CapturedShard(_shard_figures(result), found)
            if not found.data_ok():  # withdraw the record: the next run captures this shard again
                store.delete(layout.capture_record(cid, capture.SHARDS, partition))
                log(f"hidden states {partition}: failed verification; it will be captured again on the next run")
            rate = f", {result.tokens_run / result.seconds:,.0f} tokens/s" if result.seconds else ""
            log(f"hidden states {partition}: {'captured' if result.captured else 'unchanged, skipped'}, "
                f"{record['captured_rows']} rows, {record['tokens']:,} tokens{rate}")  # fmt: skip
    figures = {
        "capture_id": cid,
        "path": store.uri(layout.capture_dir(cid)),
        **{k: base[k] for k in ("checkpoint", "checkpoint_sha256", "dtype", "fp8", "tokenizer_hash", "formats")},
        **plan.record(),
    }
    return figures, shards


def _shard_figures(result: capture.ShardResult) -> dict[str, Any]:
    """A shard's own figures: what it holds, and what this run did for it."""
    record = result.record
    return {
        "captured": result.captured,
        **{name: record[name] for name in ("rows", "captured_rows", "tokens", "set_aside")},
        "tokens_run": result.tokens_run,
        "seconds": round(result.seconds, 3),
        "tokens_per_s": round(result.tokens_run / result.seconds, 1) if result.seconds else 0.0,
        "batches_run": result.batches_run,
        "batches_resumed": result.batches_resumed,
    }
