"""Which hidden states of the target a drafter trains on: the presets as data, and their numbering.

Ids here are SpecForge's: 0-based decoder-layer *outputs*. In transformers, `hidden_states[0]` is the
embeddings and `hidden_states[i + 1]` the output of decoder layer i, except the last entry, which is taken
after the final norm. SGLang (`set_eagle3_layers_to_capture`), vLLM/speculators and ModelOpt capture a
layer's *input*, which is the previous layer's output, so they write the same layers one higher:
EAGLE-3's `[1, N//2-1, N-4]` here is their `[2, N//2, N-3]` (`engine_ids`).

A preset computed for a model with too few layers (EAGLE-3 needs N >= 4, DFlash's spread N >= 4) gives
ids outside 0..N-1; each is clamped into that range, keeping the order and the count, so the files keep
the width trainers expect (3 auxiliary layers for EAGLE-3), and the plan says `clamped`. An explicit list
is never clamped: an id past the model is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from eagle_data.drafter.settings import CaptureSettings
from eagle_data.types import UserError

LastState = Literal["after_norm", "before_norm"]


class LayerError(UserError, ValueError):
    """The layers asked for do not exist in the target model; the message says what to set."""


def eagle3_ids(num_layers: int) -> list[int]:
    """SpecForge's EAGLE-3 auxiliary layers (`resolve_eagle_capture_layers`)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def dflash_ids(num_layers: int, num_draft: int) -> list[int]:
    """SpecForge's `build_target_layer_ids`: `num_draft` layers evenly spaced from 1 to N-3, rounded."""
    if num_draft == 1:
        return [num_layers // 2]
    start, end = 1, num_layers - 3
    return [round(start + i * (end - start) / (num_draft - 1)) for i in range(num_draft)]


def engine_ids(ids: list[int] | tuple[int, ...]) -> list[int]:
    """The same layers in SGLang's / vLLM's numbering (a layer's input = the previous layer's output)."""
    return [i + 1 for i in ids]


@dataclass(frozen=True)
class LayerPlan:
    """The stored layers, in order: `aux` decoder-layer outputs, then the last state when `last` is set."""

    preset: str
    aux: tuple[int, ...]
    last: LastState | None
    clamped: bool

    @property
    def count(self) -> int:
        return len(self.aux) + (self.last is not None)

    def record(self) -> dict[str, Any]:
        """What a shard's provenance says about its layers."""
        return {
            "preset": self.preset,
            "aux_layers": list(self.aux),
            "aux_layers_engine_numbering": engine_ids(self.aux),
            "last_state": self.last or "none",
            "clamped": self.clamped,
        }


def resolve(settings: CaptureSettings, num_layers: int) -> LayerPlan:
    """The layer plan of the settings for a target with `num_layers` decoder layers."""
    top = num_layers - 1
    needed = settings.capture  # the chosen trainers' preset and last state
    if isinstance(settings.layers, str):
        preset = needed.preset
        wanted = eagle3_ids(num_layers) if preset == "eagle3" else dflash_ids(num_layers, settings.dflash_layers)
    else:
        wanted, preset = list(settings.layers), "list"
        outside = [i for i in wanted if not 0 <= i <= top]
        if outside:
            raise LayerError(
                f"[drafter.capture] layers {outside} are outside the target's decoder layers 0..{top}: fix the list"
            )
    ids = tuple(min(max(i, 0), top) for i in wanted)
    return LayerPlan(preset=preset, aux=ids, last=needed.last, clamped=ids != tuple(wanted))
