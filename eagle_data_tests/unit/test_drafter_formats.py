"""The capture writers on a real batch of the demo model: each file holds its own rows' states and nothing
more, whichever way the batch's rows lie in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from eagle_data.drafter import formats
from eagle_data.drafter.capture import TransformersBackend
from eagle_data.drafter.layers import resolve
from eagle_data.drafter.settings import CaptureSettings
from eagle_data.storage import ShardStore

ROWS = [np.arange(5, 5 + n, dtype=np.int64) * 7 for n in (40, 25, 9)]


@pytest.fixture(scope="module")
def backend(demo_model: Path) -> TransformersBackend:
    return TransformersBackend(demo_model, "cpu", "fp32")


def samples(backend: TransformersBackend, settings: CaptureSettings) -> list[formats.Sample]:
    states = backend.capture(ROWS, resolve(settings, backend.num_layers))
    return [
        formats.Sample(r, f"p{r}", ids, np.ones(len(ids), dtype=np.uint8), s)
        for r, (ids, s) in enumerate(zip(ROWS, states, strict=True))
    ]


def test_a_specforge_file_of_one_layer_holds_only_its_rows_states(backend: TransformersBackend, tmp_path: Path) -> None:
    """DFlash on one layer (no last state): a row's states are a contiguous view of the batch's, which
    torch.save would write whole; each file must hold its row alone."""
    settings = CaptureSettings(dflash_layers=1, formats=("specforge-dflash",), dtype="fp32")
    plan = resolve(settings, backend.num_layers)
    batch = samples(backend, settings)
    formats.write_batch(ShardStore(str(tmp_path)), "c", "00000", 0, batch, plan, False, settings.formats)
    for s in batch:
        path = tmp_path / formats.row_key("c", "specforge-dflash", "00000", s.row, s.row)
        saved = torch.load(path, weights_only=True)["hidden_states"]
        assert torch.equal(saved, s.states.reshape(1, len(s.input_ids), -1))
        assert saved.untyped_storage().nbytes() == saved.nbytes  # not the batch's storage
        assert path.stat().st_size < s.states.nbytes + formats.SAMPLE_BYTES["specforge-dflash"] + 16 * len(s.input_ids)


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]], ids=["as-captured", "reordered"])
def test_a_native_file_holds_its_rows_end_to_end(
    backend: TransformersBackend, tmp_path: Path, order: list[int]
) -> None:
    """Rows in the order the backend returned them are written from the batch's tensor as it is; rows in
    another order are put end to end in that order."""
    settings = CaptureSettings(formats=("native",), dtype="fp32")
    plan = resolve(settings, backend.num_layers)
    batch = [samples(backend, settings)[i] for i in order]
    formats.write_batch(ShardStore(str(tmp_path)), "c", "00000", 0, batch, plan, False, settings.formats)
    saved = load_file(tmp_path / formats.native_key("c", "00000", 0))
    assert torch.equal(saved["hidden_states"], torch.cat([s.states for s in batch]))
    assert saved["input_ids"].tolist() == np.concatenate([s.input_ids for s in batch]).tolist()
