"""The hidden states of the mix: the plan that sizes their capture (`hidden_state_plan`), and the capture
itself, shard by shard, verified before its record stands (`hidden_states`); and the stored shards verified
again without capturing (`verify_stored`, a checks-only run of `hidden_states`).

The mix is read only once its bytes are those the export recorded (`mixfile.exported_file`). A shard's first
verification after its capture records the sha256 and size of every file it read
(`_digests/{partition}.json` beside the shard's record); every later one (a checks-only run, a capture run that
skips the unchanged shard) checks the files against them first: a changed file fails `ids_match_mix` with the
line naming it, and the shard loses its record, so the next capture run captures it again."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.drafter import capture, hidden_states, layers, verify
from eagle_data.drafter.mixfile import local_mix, mix_target
from eagle_data.drafter.settings import CaptureSettings, HiddenStateRecipe
from eagle_data.engines.scoring import TargetIds
from eagle_data.quality import on_policy
from eagle_data.report import Log
from eagle_data.storage import ShardStore
from eagle_data.storage.digests import materialize_command, read_record, write_record
from eagle_data.targets import load_target

PLAN_ASSET = "hidden_state_plan"
DIGESTS = "digests"  # the capture record kind holding a verified shard's file digests
T = TypeVar("T")  # what one shard's work gives: a CapturedShard, or verify.Findings


def write_hidden_state_plan(store: ShardStore, recipe: HiddenStateRecipe) -> tuple[hidden_states.Plan, str]:
    """Size the hidden-state capture of the mix for a recipe; writes the plan as JSON and returns it with
    its markdown table."""
    with local_mix(store, layout.mix()) as path:
        sized = hidden_states.plan(hidden_states.mix_token_counts(path), recipe)
    record = {"recipe": recipe.model_dump(), **sized.figures(), "per_dataset_bytes": sized.per_dataset_bytes}
    store.write_bytes(layout.drafter_file(PLAN_ASSET, "plan.json"), json.dumps(record, indent=1).encode())
    return sized, sized.markdown(recipe)


@dataclass
class CapturedShard:
    """One capture shard in a run: its own figures and what verification found in it."""

    figures: dict[str, Any]
    found: verify.Findings


@dataclass(frozen=True)
class Capture:
    """What every shard of one capture run shares: the model, its layer plan and the capture's provenance."""

    settings: CaptureSettings
    backend: capture.TransformersBackend
    plan: layers.LayerPlan
    base: dict[str, Any]  # the provenance every shard's record carries
    cid: str  # the capture id: the hash of `base`
    scored_by: TargetIds | None = None  # the rows' target, against which the capture scores a sample of rows


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
    run, shards = _each_shard(specs, store, partitions, settings, checkpoint, device, log, capture_one)
    figures = {
        "capture_id": run.cid,
        "path": store.uri(layout.capture_dir(run.cid)),
        **{k: run.base[k] for k in ("checkpoint", "checkpoint_sha256", "dtype", "fp8", "tokenizer_hash", "formats")},
        **run.plan.record(),
    }
    return figures, shards


def verify_stored(
    specs: list[DatasetSpec],
    store: ShardStore,
    partitions: Sequence[str],
    settings: CaptureSettings,
    checkpoint: str,
    device: str,
    log: Log = print,
) -> dict[str, verify.Findings]:
    """Re-verify the stored capture shards `partitions` of the current mix and capture settings without
    capturing any (a checks-only run): what `capture_one` verifies, the seeded re-capture included. A shard
    with no record of that capture (never captured, stale, or withdrawn) fails every check; one that fails
    verification loses its record, as in a capture run, so the next materialization captures it again."""
    return _each_shard(specs, store, partitions, settings, checkpoint, device, log, _verify_stored_one)[1]


def _each_shard(
    specs: list[DatasetSpec],
    store: ShardStore,
    partitions: Sequence[str],
    settings: CaptureSettings,
    checkpoint: str,
    device: str,
    log: Log,
    one: Callable[[ShardStore, Capture, Path, str, Log], T],
) -> tuple[Capture, dict[str, T]]:
    """`one` on each shard of `partitions`, with the local mix and the loaded capture, after refusing shards
    past the mix's end (before loading the model)."""
    with local_mix(store, layout.mix()) as path:
        total = refuse_past_the_mix(path, partitions, settings.shard_rows)
        run = load_capture(specs, path, settings, checkpoint, device)
        log(f"hidden states: capture {run.cid}, {run.plan.record()}, {run.backend.dtype} on {device}, "
            f"{total:,} mix rows")  # fmt: skip
        return run, {partition: one(store, run, path, partition, log) for partition in partitions}


def refuse_past_the_mix(path: Path, partitions: Sequence[str], shard_rows: int) -> int:
    """The mix's row count, after refusing capture shards that start past its end."""
    total = pl.scan_parquet(path).select(pl.len()).collect().item()
    filled = -(-total // shard_rows)
    past = [p for p in partitions if int(p) >= filled]
    if past:
        raise capture.CaptureError(
            f"capture shard(s) {', '.join(past[:3])} start past the mix's {total:,} rows: materialize shards "
            f"00000...{filled - 1:05d} only ({shard_rows:,} rows each; [drafter.capture] max_rows sets "
            "how many partitions exist)"
        )
    return total


def load_capture(
    specs: list[DatasetSpec], path: Path, settings: CaptureSettings, checkpoint: str, device: str
) -> Capture:
    """Load the checkpoint and resolve its layers: the run's model and the provenance of every shard."""
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
    return Capture(settings, backend, plan, base, capture.capture_id(base), TargetIds.of(target))


def capture_one(store: ShardStore, run: Capture, path: Path, partition: str, log: Log) -> CapturedShard:
    """Capture (or skip) and verify one shard; a shard that fails verification has its record withdrawn."""
    frame, provenance = _shard_input(run, path, partition)
    result = capture.capture_shard(
        store, run.cid, partition, frame, provenance, run.backend, run.plan, run.settings, log, run.scored_by
    )
    record = result.record
    found = _verified(store, run, partition, record, frame, log, fresh=result.captured)
    rate = f", {result.tokens_run / result.seconds:,.0f} tokens/s" if result.seconds else ""
    log(f"hidden states {partition}: {'captured' if result.captured else 'unchanged, skipped'}, "
        f"{record['captured_rows']} rows, {record['tokens']:,} tokens{rate}")  # fmt: skip
    return CapturedShard(shard_figures(result), found)


def _verify_stored_one(store: ShardStore, run: Capture, path: Path, partition: str, log: Log) -> verify.Findings:
    """Verify one shard's stored files, if its record is of the current mix rows and capture settings."""
    frame, provenance = _shard_input(run, path, partition)
    record = capture.read_record(store, run.cid, partition)
    key = capture.shard_key(capture.shard_material(provenance, run.settings, run.backend.dtype))
    if record is None or record["key"] != key:
        log(f"hidden states {partition}: nothing stored for the current capture")
        return verify.Findings(
            partition, absent=f"nothing captured of the current mix and settings (capture {run.cid})"
        )
    found = _verified(store, run, partition, record, frame, log, fresh=False)
    log(f"hidden states {partition}: stored shard re-verified, {found.samples} samples, {found.recaptured} re-captured")
    return found


def _shard_input(run: Capture, path: Path, partition: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """A shard's mix rows and the provenance its states depend on; refuses a mix whose token ids run past the
    checkpoint's vocabulary (not the mix's target)."""
    frame = capture.shard_frame(path, int(partition), run.settings.shard_rows)
    top = frame.select(pl.col("input_ids").list.max().max()).item()
    if top is not None and top >= run.backend.vocab_size:
        raise capture.CaptureError(
            f"mix row in shard {partition} holds token id {top}, past the checkpoint's vocabulary of "
            f"{run.backend.vocab_size}: the checkpoint {run.base['checkpoint']} is not the mix's target "
            f"{run.base['target']}"
        )
    rows = frame["row"]
    return frame, {**run.base, "mix_shard_sha256": capture.shard_hash(frame), "mix_rows": [rows.min(), rows.max() + 1]}


def _verified(
    store: ShardStore,
    run: Capture,
    partition: str,
    record: dict[str, Any],
    frame: pl.DataFrame,
    log: Log,
    fresh: bool,
) -> verify.Findings:
    """`verify.verify_shard` on a shard's stored files (its seeded rows re-captured), against the digests its
    first verification recorded (none when `fresh`: this run captured it, so this verification records them);
    a shard whose samples fail, or whose files changed, loses its record, so the next run captures it again."""
    settings, digests = run.settings, layout.capture_record(run.cid, DIGESTS, partition)
    stored = None if fresh else read_record(store, digests)
    repair = materialize_command(layout.HIDDEN_STATES_ASSET, partition)
    recorded = verify.Recorded(stored.files if stored else None, repair)
    found = verify.verify_shard(
        store, layout.capture_dir(run.cid), record, frame, run.plan, run.backend, settings.recapture_rows,
        settings.seed, recorded,
    )  # fmt: skip
    if not found.data_ok():
        store.delete(layout.capture_record(run.cid, capture.SHARDS, partition))
        store.delete(digests)
        log(f"hidden states {partition}: failed verification; it will be captured again on the next run")
    elif stored is None:
        write_record(store, digests, found.files)
    return found


def shard_figures(result: capture.ShardResult) -> dict[str, Any]:
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
        **record.get(on_policy.COLUMN, {}).get("figures", {}),
    }
