"""The hidden-state files trainers load, written one batch at a time and read back for checks.

Which files, keys, dtypes and shapes each target has is data in `trainers.REGISTRY`; this module turns a
sample into those tensors and back, by the entry's container:
- torch (SpecForge `.ckpt`, ModelOpt `.pt`) and safetensors (speculators `hs_{i}`): one file per row, its
  tensors built from the entry's `Tensor` list. A speculators shard also gets the prepared Arrow dataset
  (`input_ids`, `loss_mask` int64 lists, `seq_len`, and `row`, the mix row) that `ArrowDataset` loads with
  `datasets.load_from_disk`: row i of it is `hs_{i}`, the shard's captured rows in mix order.
- native: one safetensors file per batch, `native/{shard}/batch_{b}.safetensors`, rows end to end:
  `hidden_states` [tokens, layers, H], `input_ids` int32, `loss_mask` uint8, and with fp8 `scales`
  [tokens, layers] float32; `native/{shard}/index.json` says which tokens are which row.

fp8 (native only) is float8_e4m3fn with one float32 scale per token and layer, scale = max|x| / 448.
E4M3 keeps 3 mantissa bits, so a value comes back within 1/16 of itself (half a step at its exponent),
or within 2^-10 of the scale for the smallest values (subnormal steps of 2^-9): `FP8_RELATIVE`,
`FP8_OF_SCALE`.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from eagle_data import layout
from eagle_data.drafter.layers import LayerPlan
from eagle_data.drafter.trainers import NATIVE_FILES, REGISTRY, SAFETENSORS, TORCH, Trainer
from eagle_data.storage import ShardStore, write_failure

NATIVE = "native"
SPECFORGE_GROUP = 2000  # SpecForge's --file-group-size: rows per rows_{k}-{k+2000} folder
FP8_MAX = 448.0  # the largest float8_e4m3fn value
FP8_RELATIVE = 2.0**-4
FP8_OF_SCALE = 2.0**-10
INDEX_FILE = "index.json"
DATASET_FILE, DATASET_INFO, DATASET_STATE = "data-00000-of-00001.arrow", "dataset_info.json", "state.json"
DATASET_FILES = (DATASET_FILE, DATASET_INFO, DATASET_STATE)
_INT_BYTES = {"int64": 8, "int32": 4, "uint8": 1}
_DATASET_TOKEN_BYTES = 16  # the Arrow dataset's int64 input_ids and loss_mask


def _id_bytes(trainer: Trainer) -> int:
    own = sum(_INT_BYTES.get(t.dtype, 0) for t in trainer.tensors)
    return own + (_DATASET_TOKEN_BYTES if trainer.dataset else 0)


# Bytes besides the hidden-state values, per token (ids and mask) and per sample (file framing): the
# plan's formula (hidden_states.py) uses them and the `bytes_match_plan` check holds it to the files.
# Per sample: torch.save's zip of its tensors, a safetensors header (+ the Arrow dataset's row), a native
# index entry; measured with torch 2.13 / safetensors 0.8 and checked on every capture.
ID_BYTES = {name: _id_bytes(t) for name, t in REGISTRY.items()}
SAMPLE_BYTES = {name: {TORCH: 2_200, SAFETENSORS: 230, NATIVE_FILES: 60}[t.container] for name, t in REGISTRY.items()}


@dataclass(frozen=True)
class Sample:
    """One captured mix row: its global row number, its place among its shard's captured rows (mix order),
    ids and mask, and its states [seq, layers, H]."""

    row: int
    prompt_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    states: Any  # torch.Tensor, contiguous, the stored dtype
    index: int = 0


def row_key(folder: str, name: str, partition: str, row: int, index: int) -> str:
    """The file of one row in a per-row target (every one but native)."""
    group = row // SPECFORGE_GROUP * SPECFORGE_GROUP
    fields = {"group": group, "group_end": group + SPECFORGE_GROUP, "row": row, "shard": partition, "index": index}
    return layout.join(folder, name, REGISTRY[name].files.format(**fields))


def dataset_key(folder: str, name: str, partition: str, file: str) -> str:
    """A file of a shard's prepared Arrow dataset (speculators)."""
    return layout.join(folder, name, partition, file)


def native_key(folder: str, partition: str, batch: int) -> str:
    return layout.join(folder, NATIVE, partition, f"batch_{batch:05d}.safetensors")


def native_index_key(folder: str, partition: str) -> str:
    return layout.join(folder, NATIVE, partition, INDEX_FILE)


def to_fp8(states: Any) -> tuple[Any, Any]:
    """(float8_e4m3fn values, float32 scale per token and layer) of states [..., H]."""
    import torch

    wide = states.float()
    scale = (wide.abs().amax(dim=-1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    values = (wide / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values, scale


def from_fp8(values: Any, scale: Any) -> Any:
    return values.float() * scale.unsqueeze(-1)


def fp8_bound(wide: Any, scale: Any) -> Any:
    """The largest round-trip error allowed per value of `wide` (its original) under fp8."""
    return wide.abs() * FP8_RELATIVE + scale.unsqueeze(-1) * FP8_OF_SCALE


def _tensors(sample: Sample, trainer: Trainer, plan: LayerPlan) -> dict[str, Any]:
    """The tensors of one row's file, as the trainer's entry lists them; states keep the capture's dtype."""
    import torch

    seq, _, hidden = sample.states.shape
    aux = len(plan.aux)
    values = {
        "input_ids": lambda: sample.input_ids,
        "loss_mask": lambda: sample.loss_mask,
        "aux": lambda: sample.states[:, :aux].reshape(seq, aux * hidden),
        "last": lambda: sample.states[:, -1],
        "layers": lambda: sample.states,
    }
    out = {}
    for t in trainer.tensors:
        value = values[t.source]()
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value.astype(t.dtype))
        value = value.reshape(1, *value.shape) if t.batch_dim else value
        out[t.key] = _owned(value) if trainer.container == TORCH else value.contiguous()
    return out


def _owned(tensor: Any) -> Any:
    """`tensor` alone in its storage: torch.save writes a view's whole storage (here the batch's states), so a
    view is copied; a reshape that already copied is kept as it is."""
    import torch

    if tensor.untyped_storage().nbytes() == tensor.nbytes:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)  # preserve_format would keep a view's gaps


def _end_to_end(states: Sequence[Any]) -> Any:
    """The states of a batch's samples as one tensor [tokens, layers, H]: a view when they already lie end to
    end in one storage (as `TransformersBackend` returns a batch), else a copy."""
    import torch

    first = states[0]
    offset, storage = first.storage_offset(), first.untyped_storage().data_ptr()
    for s in states:
        if not s.is_contiguous() or s.untyped_storage().data_ptr() != storage or s.storage_offset() != offset:
            return torch.cat(list(states))
        offset += s.numel()
    _, layers, hidden = first.shape
    return first.as_strided((sum(len(s) for s in states), layers, hidden), (layers * hidden, hidden, 1))


@contextmanager
def _staged(store: ShardStore, key: str) -> Iterator[Path]:
    """`store.staged` without fsync, a refused write (its folder, its temporary file, its bytes) raised as
    one line naming the file."""
    try:
        with store.staged(key, sync=False) as tmp:
            yield tmp
    except OSError as exc:
        raise write_failure(store.root, key, exc) from None


def write_batch(
    store: ShardStore, folder: str, partition: str, batch: int, samples: Sequence[Sample], plan: LayerPlan, fp8: bool,
    formats: Sequence[str],
) -> None:  # fmt: skip
    """Write one batch for every chosen target; each file is written straight to a temporary file that replaces
    its key when complete (`ShardStore.staged`), so a killed run leaves none half-written. Without an fsync
    per file (8 ms each here): a power cut can lose recent files, which verification finds (`verify.py`), and
    the shard is then captured again. A refused write fails the batch, before its progress is recorded, in
    one line naming the file."""
    import torch
    from safetensors.torch import save_file

    for name in formats:
        trainer = REGISTRY[name]
        if trainer.container == NATIVE_FILES:
            _write_native(store, folder, partition, batch, samples, fp8)
            continue
        for s in samples:
            key = row_key(folder, name, partition, s.row, s.index)
            if trainer.container == TORCH:
                # Through a Python file object: torch's own file writer costs ~0.2 ms more CPU per file and
                # names the zip's folder after the temporary file; this way it is always `archive/`.
                with _staged(store, key) as tmp, tmp.open("wb") as fh:
                    torch.save(_tensors(s, trainer, plan), fh)
            else:
                with _staged(store, key) as tmp:
                    save_file(_tensors(s, trainer, plan), tmp)


def _write_native(
    store: ShardStore, folder: str, partition: str, batch: int, samples: Sequence[Sample], fp8: bool
) -> None:
    import torch
    from safetensors.torch import save_file

    states = _end_to_end([s.states for s in samples]) if samples else torch.empty(0)
    tensors = {
        "input_ids": torch.from_numpy(np.concatenate([s.input_ids for s in samples]).astype(np.int32)),
        "loss_mask": torch.from_numpy(np.concatenate([s.loss_mask for s in samples]).astype(np.uint8)),
    }
    if fp8:
        tensors["hidden_states"], tensors["scales"] = to_fp8(states)
    else:
        tensors["hidden_states"] = states
    with _staged(store, native_key(folder, partition, batch)) as tmp:
        save_file(tensors, tmp)


def write_dataset(store: ShardStore, folder: str, name: str, partition: str, rows: pl.DataFrame) -> None:
    """A shard's prepared Arrow dataset as `datasets.save_to_disk` lays it out (torch format), from `rows`
    (row, input_ids, loss_mask) in `hs_{i}` order; written with polars, read by `datasets.load_from_disk`."""
    frame = rows.select(
        pl.col("input_ids").cast(pl.List(pl.Int64)),
        pl.col("loss_mask").cast(pl.List(pl.Int64)),
        pl.col("input_ids").list.len().cast(pl.Int64).alias("seq_len"),
        pl.col("row").cast(pl.Int64),
    )
    buf = io.BytesIO()
    frame.write_ipc_stream(buf, compat_level=pl.CompatLevel.oldest())
    data = buf.getvalue()
    ints = {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "LargeList"}
    one = {"dtype": "int64", "_type": "Value"}
    info = {"features": {"input_ids": ints, "loss_mask": ints, "seq_len": one, "row": one}}
    state = {
        "_data_files": [{"filename": DATASET_FILE}],
        "_fingerprint": hashlib.sha256(data).hexdigest()[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": "torch",
        "_output_all_columns": False,
        "_split": None,
    }
    for file, content in ((DATASET_FILE, data), (DATASET_INFO, json.dumps(info).encode()),
                          (DATASET_STATE, json.dumps(state).encode())):  # fmt: skip
        store.write_bytes(dataset_key(folder, name, partition, file), content)


def read_dataset(data: bytes) -> pl.DataFrame:
    """The Arrow dataset's rows (input_ids, loss_mask, seq_len, row), in `hs_{i}` order."""
    return pl.read_ipc_stream(io.BytesIO(data))


def native_index(
    partition: str, batches: Sequence[Sequence[tuple[int, str, int]]], plan: LayerPlan, fp8: bool
) -> dict[str, Any]:
    """The JSON index of a shard's native files: per batch file, each row's (row, prompt_id, start, length)."""
    files = []
    for b, rows in enumerate(batches):
        start, entries = 0, []
        for row, prompt_id, length in rows:
            entries.append([row, prompt_id, start, length])
            start += length
        files.append({"file": f"batch_{b:05d}.safetensors", "rows": entries})
    return {"shard": partition, "layers": plan.record(), "fp8": fp8, "files": files}


def write_native_index(store: ShardStore, folder: str, partition: str, index: dict[str, Any]) -> None:
    store.write_bytes(native_index_key(folder, partition), json.dumps(index).encode())


@dataclass(frozen=True)
class Stored:
    """A sample as read back from one format: ids, mask (None where the format has none), states as
    float32 [seq, layers, H], and for fp8 the scales [seq, layers]."""

    row: int
    input_ids: np.ndarray
    loss_mask: np.ndarray | None
    states: Any
    scales: Any = None


def read_row(data: bytes, trainer: Trainer, row: int, plan: LayerPlan) -> Stored:
    """One per-row file back as a sample: its ids, mask (None where the file has none) and states
    [seq, layers, H] as float32, the layers this trainer stores (`stored_layers`)."""
    import torch
    from safetensors.torch import load

    obj = load(data) if trainer.container == SAFETENSORS else torch.load(io.BytesIO(data), weights_only=True)
    by_source = {t.source: obj[t.key].reshape(obj[t.key].shape[1:]) if t.batch_dim else obj[t.key]
                 for t in trainer.tensors}  # fmt: skip
    if "layers" in by_source:
        states = by_source["layers"]
    else:
        aux = by_source["aux"]
        parts = [aux.reshape(aux.shape[0], len(plan.aux), -1)]
        if "last" in by_source and plan.last is not None:
            parts.append(by_source["last"].reshape(aux.shape[0], 1, -1))
        states = torch.cat(parts, dim=1)
    mask = by_source.get("loss_mask")
    return Stored(row, by_source["input_ids"].numpy(), None if mask is None else mask.numpy(), states.float())


def stored_layers(trainer: Trainer, plan: LayerPlan) -> int:
    """How many of the plan's layers the trainer's files hold (DFlash's files may leave out the last state)."""
    sources = {t.source for t in trainer.tensors}
    return plan.count if "layers" in sources or "last" in sources else len(plan.aux)


def read_native(data: bytes, entries: Sequence[Sequence[Any]]) -> Iterator[Stored]:
    """The rows of one native batch file, by its index entries [row, prompt_id, start, length]."""
    from safetensors.torch import load

    obj = load(data)
    scales = obj.get("scales")
    wide = from_fp8(obj["hidden_states"], scales) if scales is not None else obj["hidden_states"].float()
    ids, mask = obj["input_ids"].numpy(), obj["loss_mask"].numpy()
    for row, _, start, length in entries:
        end = start + length
        yield Stored(
            int(row), ids[start:end], mask[start:end], wide[start:end], None if scales is None else scales[start:end]
        )
