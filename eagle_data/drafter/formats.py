"""The hidden-state layouts drafter trainers load, written one batch at a time and read back for checks.

- `specforge`: SpecForge's offline layout (`scripts/prepare_hidden_states.py`): one `torch.save` dict per
  sample at `specforge/rows_{k}-{k+2000}/data_{row}.ckpt` (k: the row's group of 2,000, by global mix row).
  EAGLE-3: `input_ids` (seq) and `loss_mask` (seq) int64, `hidden_state` (1, seq, H) the last state,
  `aux_hidden_state` (1, seq, A*H) the auxiliary layers concatenated; DFlash: `input_ids`, `loss_mask`,
  `hidden_states` (1, seq, A*H).
- `speculators`: vLLM's `extract_hidden_states` files that speculators trains on: `speculators/{row}.safetensors`
  with `hidden_states` [seq, layers, H] (auxiliary layers, then the last) and `token_ids` [seq] int64; we
  add `loss_mask` [seq] uint8 (readers that do not know it ignore it).
- `native`: one safetensors file per batch, `native/{shard}/batch_{b}.safetensors`, rows end to end:
  `hidden_states` [tokens, layers, H], `input_ids` int32, `loss_mask` uint8, and with fp8 `scales`
  [tokens, layers] float32; `native/{shard}/index.json` says which tokens are which row.

fp8 (native only) is float8_e4m3fn with one float32 scale per token and layer, scale = max|x| / 448.
E4M3 keeps 3 mantissa bits, so a value comes back within 1/16 of itself (half a step at its exponent),
or within 2^-10 of the scale for the smallest values (subnormal steps of 2^-9): `FP8_RELATIVE`,
`FP8_OF_SCALE`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eagle_data import layout
from eagle_data.drafter.layers import LayerPlan
from eagle_data.storage import ShardStore, write_failure

SPECFORGE, SPECULATORS, NATIVE = "specforge", "speculators", "native"
FORMATS = (SPECFORGE, SPECULATORS, NATIVE)
SPECFORGE_GROUP = 2000  # SpecForge's --file-group-size: rows per rows_{k}-{k+2000} folder
FP8_MAX = 448.0  # the largest float8_e4m3fn value
FP8_RELATIVE = 2.0**-4
FP8_OF_SCALE = 2.0**-10
INDEX_FILE = "index.json"

# Bytes besides the hidden-state values, per token (ids and mask) and per sample (file framing): the
# plan's formula (hidden_states.py) uses them and the `bytes_match_plan` check holds it to the files.
# Per sample: torch.save's zip of four tensors, a safetensors header, a native index entry; measured with
# torch 2.13 / safetensors 0.8 and checked on every capture.
ID_BYTES = {SPECFORGE: 16, SPECULATORS: 9, NATIVE: 5}
SAMPLE_BYTES = {SPECFORGE: 2_200, SPECULATORS: 230, NATIVE: 60}


@dataclass(frozen=True)
class Sample:
    """One captured mix row: its global row number, ids and mask, and its states [seq, layers, H]."""

    row: int
    prompt_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    states: Any  # torch.Tensor, contiguous, the stored dtype


def specforge_key(folder: str, row: int) -> str:
    group = row // SPECFORGE_GROUP * SPECFORGE_GROUP
    return layout.join(folder, SPECFORGE, f"rows_{group}-{group + SPECFORGE_GROUP}", f"data_{row}.ckpt")


def speculators_key(folder: str, row: int) -> str:
    return layout.join(folder, SPECULATORS, f"{row}.safetensors")


def row_key(folder: str, fmt: str, row: int) -> str:
    """The file of one row in a per-row format (specforge, speculators)."""
    return specforge_key(folder, row) if fmt == SPECFORGE else speculators_key(folder, row)


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


def _specforge_dict(sample: Sample, plan: LayerPlan) -> dict[str, Any]:
    import torch

    seq, _, hidden = sample.states.shape
    ids = torch.from_numpy(sample.input_ids.astype(np.int64))
    mask = torch.from_numpy(sample.loss_mask.astype(np.int64))
    aux = _owned(sample.states[:, : len(plan.aux)].reshape(1, seq, len(plan.aux) * hidden))
    if plan.last is None:
        return {"input_ids": ids, "loss_mask": mask, "hidden_states": aux}
    last = _owned(sample.states[:, -1].reshape(1, seq, hidden))
    return {"input_ids": ids, "loss_mask": mask, "hidden_state": last, "aux_hidden_state": aux}


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
    """Write one batch in every format; each file is written straight to a temporary file that replaces its
    key when complete (`ShardStore.staged`), so a killed run leaves none half-written. Without an fsync per
    file (8 ms each here): a power cut can lose recent files, which verification finds (`verify.py`), and
    the shard is then captured again. A refused write fails the batch, before its progress is recorded, in
    one line naming the file."""
    import torch
    from safetensors.torch import save_file

    for fmt in formats:
        if fmt == SPECFORGE:
            for s in samples:
                # Through a Python file object: torch's own file writer costs ~0.2 ms more CPU per file and
                # names the zip's folder after the temporary file; this way it is always `archive/`.
                with _staged(store, specforge_key(folder, s.row)) as tmp, tmp.open("wb") as fh:
                    torch.save(_specforge_dict(s, plan), fh)
        elif fmt == SPECULATORS:
            for s in samples:
                tensors = {
                    "hidden_states": s.states,
                    "token_ids": torch.from_numpy(s.input_ids.astype(np.int64)),
                    "loss_mask": torch.from_numpy(s.loss_mask.astype(np.uint8)),
                }
                with _staged(store, speculators_key(folder, s.row)) as tmp:
                    save_file(tensors, tmp)
        else:
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


def read_specforge(data: bytes, row: int, plan: LayerPlan) -> Stored:
    import torch

    obj = torch.load(io.BytesIO(data), weights_only=True)
    aux = obj["hidden_states"] if plan.last is None else obj["aux_hidden_state"]
    seq = aux.shape[1]
    layers = [aux.reshape(seq, len(plan.aux), -1)]
    if plan.last is not None:
        layers.append(obj["hidden_state"].reshape(seq, 1, -1))
    states = torch.cat(layers, dim=1).float()
    return Stored(row, obj["input_ids"].numpy(), obj["loss_mask"].numpy(), states)


def read_speculators(data: bytes, row: int) -> Stored:
    from safetensors.torch import load

    obj = load(data)
    return Stored(row, obj["token_ids"].numpy(), obj["loss_mask"].numpy(), obj["hidden_states"].float())


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
