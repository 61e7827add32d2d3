"""Capture the target's hidden states over the training mix, shard by shard, resumable by batch.

The mix's rows are cut into fixed capture shards (row r is in shard r // shard_rows), the asset's
partitions. A shard's rows are grouped by length into batches of at most `batch_tokens` padded tokens;
each batch runs one forward pass, its states are written in every configured format (`formats.py`, each
file atomically) and then the shard's progress file records the batch. Only one batch of states is held
in memory. A killed run resumes after the last recorded batch: at most the batch in flight is repeated.

A finished shard writes its record (`_shards/{partition}.json`): the checkpoint (path and content hash),
layers, dtype, norm setting, target tokenizer hash and the shard's content hash, whose digest is the
shard's key. A re-run skips a shard whose key is unchanged and captures it afresh otherwise.

The forward pass sits behind `CaptureBackend`; `TransformersBackend` runs a checkpoint with
`output_hidden_states=True` (bf16 on GPU, fp32 or bf16 on CPU). docs/hidden-states.md says how an
engine-side backend (vLLM's `extract_hidden_states`, SGLang in-process) plugs in.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl

from eagle_data import layout
from eagle_data.demo import ensure_demo_model
from eagle_data.drafter import formats, trainers
from eagle_data.drafter.layers import LayerPlan
from eagle_data.drafter.scores import ShardScores, forward
from eagle_data.drafter.settings import CaptureSettings
from eagle_data.engines import scoring
from eagle_data.engines.cpus import torch_threads
from eagle_data.engines.scoring import batches  # one batching for the capture and the scorer
from eagle_data.quality import on_policy
from eagle_data.quality.on_policy import Scored
from eagle_data.settings import get as environment
from eagle_data.storage import ShardStore
from eagle_data.types import UserError

Log = Callable[[str], None]
SHARDS, PROGRESS = "shards", "progress"
EMPTY = "empty"
TOP_K = 20  # the target's most likely tokens read per scored position (as the validation scorers')
FLOOR_REASONS = {  # a chosen trainer's supervised-token floor (trainers.Trainer.floor) -> the set-aside reason
    "consecutive": "no_adjacent_supervised_tokens",  # SpecForge's DFlash family (since 2026-07-30)
    "supervised": "unsupervised",  # speculators' prepare step drops rows without a supervised token
}


class CaptureError(UserError, ValueError):
    """The capture cannot run as configured; the message says what to set or materialize."""


class CaptureBackend(Protocol):
    """Runs the target over token ids and returns the chosen hidden states."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str  # the stored dtype: bf16 or fp32

    def capture(self, rows: Sequence[np.ndarray], plan: LayerPlan) -> list[Any]:
        """Per row, its states as a contiguous CPU tensor [len(row), plan.count, hidden_size] in `dtype` (it
        may be a view into a batch's tensor: a writer that pickles storages copies it first; rows that lie end
        to end in one tensor are written by the native writer without a copy):
        the outputs of decoder layers `plan.aux`, then the last state when `plan.last` is set."""
        ...


def resolve_dtype(dtype: str, device: str) -> str:
    return ("bf16" if device.startswith("cuda") else "fp32") if dtype == "auto" else dtype


class TransformersBackend:
    """A transformers checkpoint in this process: its base model runs the batches, right-padded with an
    attention mask, so a row's states do not depend on the rows beside it; its LM head runs only on the
    supervised positions of the rows asked to be scored (`capture_scored`: the on-policy figures)."""

    def __init__(self, checkpoint: Path, device: str, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.dtype = dtype
        self._torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        full = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=self._torch_dtype).to(device).eval()
        self.model, self.head = full.get_decoder(), full.get_output_embeddings()
        config = self.model.config.get_text_config()
        self.num_layers, self.hidden_size, self.vocab_size = (
            config.num_hidden_layers, config.hidden_size, config.vocab_size
        )  # fmt: skip
        self.device = device

    def capture(self, rows: Sequence[np.ndarray], plan: LayerPlan) -> list[Any]:
        return self.capture_scored(rows, plan, {})[0]

    def capture_scored(
        self, rows: Sequence[np.ndarray], plan: LayerPlan, score: Mapping[int, scoring.Row], top_k: int = TOP_K
    ) -> tuple[list[Any], dict[int, Scored]]:
        """`capture`, and for the rows of `score` (index in `rows` -> its mask and sampling settings) their
        on-policy figures from the same forward pass: the LM head over their supervised positions' final
        states (after the norm: `hidden_states[-1]`)."""
        torch = self.torch
        lengths = [len(r) for r in rows]
        ids = torch.zeros((len(rows), max(lengths)), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.from_numpy(row.astype(np.int64))
            mask[b, : len(row)] = 1
        pre_norm: list[Any] = []  # the last decoder layer's output: hidden_states[-1] is after the norm
        hook = self.model.norm.register_forward_pre_hook(lambda _module, args: pre_norm.append(args[0]))
        try:
            with torch.inference_mode(), torch_threads():  # a busy core's second thread spins: engines/cpus.py
                out = self.model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                    output_hidden_states=True, use_cache=False,
                )  # fmt: skip
        finally:
            hook.remove()
        top = self.num_layers - 1
        picked = [out.hidden_states[i + 1] if i < top else pre_norm[0] for i in plan.aux]
        if plan.last is not None:
            picked.append(out.hidden_states[-1] if plan.last == "after_norm" else pre_norm[0])
        # One copy of the real tokens (no padding), rows end to end [tokens, layers, H], then one transfer to
        # the CPU: each row is a contiguous view of it, and the native writer stores it without another copy.
        packed = picked[0].new_empty((sum(lengths), len(picked), picked[0].shape[-1]))
        start = 0
        for b, n in enumerate(lengths):
            torch.stack([p[b, :n] for p in picked], dim=1, out=packed[start : start + n])
            start += n
        packed = packed.to("cpu")
        with torch.inference_mode(), torch_threads():
            scored = {
                b: scoring.head_figures(torch, out.hidden_states[-1][b, : lengths[b]], self.head, row, top_k)
                for b, row in score.items()
            }
        return list(packed.split(lengths)), scored


def checkpoint_folder(checkpoint: str) -> Path:
    path = Path(checkpoint).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise CaptureError(
            f"no transformers checkpoint at {path}: set EAGLE_DATA_CAPTURE_CHECKPOINT (or the capture resource's "
            "checkpoint) to a local model folder"
        )
    return path


CHUNK = 1 << 20  # bytes read at a time while hashing a checkpoint's files


@cache
def _folder_hash(path: Path, signature: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, _ in signature:
        digest.update(name.encode() + b"\0")
        with (path / name).open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def checkpoint_hash(path: Path) -> str:
    """SHA-256 over the checkpoint's files (names and bytes), once per process while they are unchanged."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    signature = tuple((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _folder_hash(path, signature)


def shard_frame(path: Path, index: int, shard_rows: int) -> pl.DataFrame:
    """Rows [index * shard_rows, +shard_rows) of the mix file: `row` (global), prompt_id, ids, mask."""
    start = index * shard_rows
    scan = pl.scan_parquet(path)
    sampling = ["sampling"] if "sampling" in scan.collect_schema() else []  # to score rows at their settings
    return (
        scan.select("prompt_id", "input_ids", "loss_mask", *sampling)
        .slice(start, shard_rows)
        .collect()
        .with_row_index("row", offset=start)
        .cast({"row": pl.Int64})
    )


def shard_hash(frame: pl.DataFrame) -> str:
    """SHA-256 of a shard's rows: each row's number, prompt id, ids and mask."""
    digest = hashlib.sha256()
    for row, prompt_id, ids, mask in frame.select("row", "prompt_id", "input_ids", "loss_mask").iter_rows():
        digest.update(f"{row}\0{prompt_id}\0{len(ids)}\0".encode())
        digest.update(np.asarray(ids, dtype=np.int64).tobytes() + np.asarray(mask, dtype=np.uint8).tobytes())
    return digest.hexdigest()


def set_aside(frame: pl.DataFrame, settings: CaptureSettings) -> dict[int, str]:
    """Rows not captured, each with its reason: empty rows, and rows under a chosen trainer's supervised-token
    floor (the trainer would refuse them; every captured row is stored for every chosen trainer)."""
    floors = sorted({t.floor for t in trainers.chosen(settings.formats) if t.floor})
    out = {}
    for row, mask in frame.select("row", "loss_mask").iter_rows():
        refused = next((FLOOR_REASONS[f] for f in floors if trainers.refuses(f, mask)), None)
        if not mask or refused:
            out[row] = refused if mask else EMPTY
    return out


def _arrays(column: pl.Series, dtype: type) -> list[np.ndarray]:
    """Each row's list as a numpy array in `dtype`: views into one flat array, made in one pass rather than
    through Python lists (rows must not be empty: `set_aside` takes those out)."""
    if column.is_empty():
        return []
    values = column.explode()
    if values.null_count():
        raise CaptureError(f"training_mix's {column.name} holds a null value: materialize training_mix again")
    return np.split(values.to_numpy().astype(dtype, copy=False), np.cumsum(column.list.len().to_numpy())[:-1])


def capture_id(provenance: dict[str, Any]) -> str:
    """The capture folder's name: what makes states comparable across shards (not the shard, not formats)."""
    keep = ("checkpoint_sha256", "layers", "dtype", "fp8", "tokenizer_hash")
    text = json.dumps({k: provenance[k] for k in keep}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class ShardResult:
    """One shard's outcome: its record (provenance and figures) and whether this run captured it."""

    partition: str
    record: dict[str, Any]
    captured: bool
    batches_run: int = 0
    batches_resumed: int = 0
    seconds: float = 0.0
    tokens_run: int = 0


def _read_json(store: ShardStore, key: str) -> dict[str, Any] | None:
    return json.loads(store.read_bytes(key)) if store.exists(key) else None


def _remove_stale(store: ShardStore, folder: str, partition: str, old: dict[str, Any]) -> None:
    """Delete the files an older capture of this shard wrote (its rows may now be set aside)."""
    rows = sorted(row for batch in old.get("batches", []) for row, _, _ in batch)
    for name in old.get("formats", []):
        trainer = trainers.REGISTRY.get(name)
        if trainer is None:  # a target this version no longer has
            continue
        if trainer.container == trainers.NATIVE_FILES:
            for b in range(len(old.get("batches", []))):
                store.delete(formats.native_key(folder, partition, b))
            continue
        for index, row in enumerate(rows):
            store.delete(formats.row_key(folder, name, partition, row, index))


def _write_shard_files(
    store: ShardStore,
    folder: str,
    partition: str,
    batches_rows: list[list[list[Any]]],
    kept: pl.DataFrame,
    plan: LayerPlan,
    settings: CaptureSettings,
) -> None:
    """A finished shard's own files: the native index, and the prepared dataset of each target that has one
    (its rows in mix order, as `hs_{i}` were numbered)."""
    if formats.NATIVE in settings.formats:
        entries = [[tuple(m) for m in batch] for batch in batches_rows]
        index = formats.native_index(partition, entries, plan, settings.fp8)
        formats.write_native_index(store, folder, partition, index)
    for trainer in trainers.chosen(settings.formats):
        if trainer.dataset:
            formats.write_dataset(store, folder, trainer.name, partition, kept.select("row", "input_ids", "loss_mask"))


def _figures(rows: int, aside: dict[int, str], batches_rows: list[list[list[Any]]]) -> dict[str, Any]:
    """A shard record's counts: rows, captured rows and tokens, rows set aside (by reason, and each)."""
    return {
        "rows": rows,
        "captured_rows": sum(len(batch) for batch in batches_rows),
        "tokens": sum(n for batch in batches_rows for _, _, n in batch),
        "set_aside": {reason: sum(1 for r in aside.values() if r == reason) for reason in sorted(set(aside.values()))},
        "set_aside_rows": {str(row): reason for row, reason in sorted(aside.items())},
        "batches": batches_rows,
    }


def shard_material(provenance: dict[str, Any], settings: CaptureSettings, dtype: str) -> dict[str, Any]:
    """What a shard's stored files depend on: its provenance, and the settings that shape the files and the
    batches (a resume must re-form the same batches)."""
    shaped_by = {"formats": list(settings.formats), "fp8": settings.fp8, "batch_tokens": settings.batch_tokens}
    return {**provenance, **shaped_by, "dtype": dtype}


def shard_key(material: dict[str, Any]) -> str:
    """A shard record's key: the digest of its `shard_material`; a record with another key is stale."""
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def read_record(store: ShardStore, cid: str, partition: str) -> dict[str, Any] | None:
    """A finished shard's record in capture `cid`, or None when it has none."""
    return _read_json(store, layout.capture_record(cid, SHARDS, partition))


def capture_shard(
    store: ShardStore,
    cid: str,
    partition: str,
    frame: pl.DataFrame,
    provenance: dict[str, Any],
    backend: CaptureBackend,
    plan: LayerPlan,
    settings: CaptureSettings,
    log: Log = print,
    scored_by: scoring.TargetIds | None = None,
) -> ShardResult:
    """Capture one shard into capture `cid` (or skip it when its record's key matches), resuming from its
    progress file. `provenance` names what the states depend on; the digest of its `shard_material` is the
    shard's key. With `scored_by` (the rows' target), some rows' on-policy figures too (`scores.py`)."""
    material = shard_material(provenance, settings, backend.dtype)
    key = shard_key(material)
    folder = layout.capture_dir(cid)
    record_key, progress_key = (layout.capture_record(cid, kind, partition) for kind in (SHARDS, PROGRESS))
    old = _read_json(store, record_key)
    if old is not None and old["key"] == key:
        return ShardResult(partition, old, captured=False)
    aside = set_aside(frame, settings)
    kept = frame.filter(~pl.col("row").is_in(list(aside)))  # in mix order: row i of a shard's dataset is hs_{i}
    rows = list(zip(kept["row"].to_list(), kept["prompt_id"].to_list(), strict=True))
    ids, masks = _arrays(kept["input_ids"], np.int64), _arrays(kept["loss_mask"], np.uint8)
    groups = batches([len(i) for i in ids], settings.batch_tokens)
    progress = _read_json(store, progress_key)
    if progress is None or progress["key"] != key:
        for stale in (old, progress):
            if stale is not None:
                _remove_stale(store, folder, partition, stale)
        progress = {"key": key, "formats": list(settings.formats), "batches": []}
    done = len(progress["batches"])
    result = ShardResult(partition, {}, captured=True, batches_resumed=done)
    if done:
        log(f"hidden states {partition}: resuming at batch {done + 1} of {len(groups)}")
    started = time.perf_counter()
    scores = ShardScores.plan(kept, ids, masks, settings, scored_by, progress) if scored_by else None
    for b in range(done, len(groups)):
        states = forward(backend, [ids[i] for i in groups[b]], plan, scores, groups[b], [r for r, _ in rows])
        samples = [
            formats.Sample(*rows[i], ids[i], masks[i], s, index=i) for i, s in zip(groups[b], states, strict=True)
        ]  # fmt: skip
        formats.write_batch(store, folder, partition, b, samples, plan, settings.fp8, settings.formats)
        progress["batches"].append([[s.row, s.prompt_id, len(s.input_ids)] for s in samples])
        store.write_bytes(progress_key, json.dumps(progress).encode())
        result.batches_run += 1
        result.tokens_run += sum(len(s.input_ids) for s in samples)
    result.seconds = time.perf_counter() - started
    batches_rows = progress["batches"]
    _write_shard_files(store, folder, partition, batches_rows, kept, plan, settings)
    record = {"key": key, "partition": partition, **material, **_figures(frame.height, aside, batches_rows)}
    if scores is not None and (scored := scores.record()):
        record[on_policy.COLUMN] = scored
    store.write_bytes(record_key, json.dumps(record).encode())
    store.delete(progress_key)
    result.record = record
    return result


CHECKPOINT_ENV = "EAGLE_DATA_CAPTURE_CHECKPOINT"
DEVICE_ENV = "EAGLE_DATA_CAPTURE_DEVICE"


def resolve_target(checkpoint: str | None, device: str | None, demo: bool) -> tuple[str, str]:
    """(checkpoint folder, device): the given values, else the environment's, else on the demo profile the
    demo checkpoint (built on first use) and cuda when present, else cpu."""
    checkpoint = checkpoint or environment(CHECKPOINT_ENV)
    if not checkpoint and demo:
        checkpoint = str(ensure_demo_model())
    if not checkpoint:
        raise CaptureError(
            f"no checkpoint to capture hidden states from: set {CHECKPOINT_ENV} to the target model's local "
            "transformers folder (or EAGLE_DATA_PROFILE=demo for the demo model)"
        )
    device = device or environment(DEVICE_ENV)
    if not device:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return checkpoint, device
