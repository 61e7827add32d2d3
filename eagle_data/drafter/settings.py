"""The catalog's `[drafter]` table: draft vocabulary sizes and the other drafter-input settings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eagle_data.catalog import Section, current
from eagle_data.drafter import trainers
from eagle_data.quality.evalsets import Decontamination


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HiddenStateRecipe(_Frozen):
    """How a drafter's offline training captures the target's hidden states, to size the capture.

    Attributes:
    captured_layers: hidden-state tensors stored per token (EAGLE-3: three auxiliary layers + the last).
    hidden_size: the target model's hidden size (Qwen3-8B: 4096).
    dtype: bf16 (2 bytes a value), fp32 (4), or fp8 (1 byte a value plus one float32 scale per token and
        layer; the native format only).
    format: the export target (`eagle_data/drafter/trainers.py`): its ids, mask and per-file bytes.
    target_params_b: the target's parameters in billions; a forward pass costs 2 FLOPs per parameter a token.
    gpu_tflops: dense bf16 TFLOP/s of one GPU (H100 SXM: 989).
    mfu: the share of that the capture achieves (prefill only; 0.4 is a planning figure, measure yours).
    """

    captured_layers: int = Field(4, gt=0)
    hidden_size: int = Field(4096, gt=0)
    dtype: Literal["bf16", "fp32", "fp8"] = "bf16"
    format: Literal[trainers.NAMES] = "specforge-eagle3"  # type: ignore[valid-type]
    target_params_b: float = Field(8.0, gt=0)
    gpu_tflops: float = Field(989.0, gt=0)
    mfu: float = Field(0.4, gt=0, le=1)

    @model_validator(mode="after")
    def _fp8_native(self) -> HiddenStateRecipe:
        if self.dtype == "fp8" and self.format != "native":
            raise ValueError('fp8 is stored by the native format only: set format = "native"')
        return self


class CaptureSettings(_Frozen):
    """What the `hidden_states` asset captures and how (`eagle_data/drafter/capture.py`).

    Attributes:
    formats: the export targets written, one per trainer and drafter kind (`trainers.REGISTRY`): choosing
        them picks the layers, the last state's norm, the rows set aside and the files.
    layers: "auto" (the chosen trainers' preset), "eagle3" (SpecForge's [1, N//2-1, N-4] plus the last
        state), "dflash" (`dflash_layers` evenly spaced from 1 to N-3) or an explicit list of decoder-layer
        ids (0-based outputs, SpecForge numbering).
    last_state: "auto" (what the chosen trainers read), "after_norm", "before_norm" or "none"; a value a
        chosen trainer cannot use is refused.
    dflash_layers: how many target layers a DFlash drafter reads.
    dtype: "auto" (bf16 on GPU, fp32 on CPU), "bf16" or "fp32": the forward pass and what is stored.
    fp8: the native format stores fp8 values and a float32 scale per token and layer (the others keep dtype).
    shard_rows: mix rows per capture shard (partition); row r is always in shard r // shard_rows.
    max_rows: the mix rows the partitions cover (partitions = max_rows / shard_rows, rounded up).
    batch_tokens: padded tokens per forward pass (rows grouped by length); a longer row runs alone.
    recapture_rows: rows per shard the `recapture_matches` check captures again and compares.
    on_policy_rows: rows per shard whose on-policy figures (the target's own score, quality/on_policy.py) the
        capture takes from its forward passes: the LM head over their supervised positions only.
    seed: picks those rows.
    """

    formats: tuple[Literal[trainers.NAMES], ...] = Field(("specforge-eagle3",), min_length=1)  # type: ignore[valid-type]
    layers: Literal["auto", "eagle3", "dflash"] | tuple[int, ...] = "auto"
    last_state: Literal["auto", "after_norm", "before_norm", "none"] = "auto"
    dflash_layers: int = Field(5, gt=0)
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    fp8: bool = False
    shard_rows: int = Field(2000, gt=0)
    max_rows: int = Field(1_000_000, gt=0)
    batch_tokens: int = Field(16_384, gt=0)
    recapture_rows: int = Field(2, ge=0)
    on_policy_rows: int = Field(8, ge=0)
    seed: int = 0

    @field_validator("layers")
    @classmethod
    def _some_layers(cls, layers: str | tuple[int, ...]) -> str | tuple[int, ...]:
        if isinstance(layers, tuple) and (not layers or min(layers) < 0 or len(set(layers)) != len(layers)):
            raise ValueError('[drafter.capture] layers: name distinct decoder-layer ids >= 0, or "auto": an empty '
                             "list would capture no hidden state for a drafter to learn from")  # fmt: skip
        return layers

    @model_validator(mode="after")
    def _consistent(self) -> CaptureSettings:
        if len(set(self.formats)) != len(self.formats):
            raise ValueError("formats must be distinct")
        if self.fp8 and "native" not in self.formats:
            raise ValueError('fp8 is stored by the native format only: add "native" to formats')
        trainers.resolve(self.formats, self.layers, self.last_state)  # refuses what a chosen trainer cannot use
        return self

    @property
    def capture(self) -> trainers.Capture:
        """The layer preset and last state the chosen trainers need (`trainers.resolve`)."""
        return trainers.resolve(self.formats, self.layers, self.last_state)

    @property
    def partitions(self) -> int:
        return -(-self.max_rows // self.shard_rows)


class DrafterSettings(Section):
    """The catalog's `[drafter]` table. Attributes:
    draft_vocab_sizes: one EAGLE-3 draft vocabulary mapping is written per size (top-N supervised tokens).
    decontamination: which benchmarks rows are checked against.
    hidden_states: the capture recipe the hidden-state plan sizes.
    capture: what the hidden-state capture stores.
    """

    TABLE = "drafter"

    draft_vocab_sizes: tuple[int, ...] = Field((32_000, 64_000), min_length=1)
    decontamination: Decontamination = Decontamination()
    hidden_states: HiddenStateRecipe = HiddenStateRecipe()
    capture: CaptureSettings = CaptureSettings()

    @field_validator("draft_vocab_sizes")
    @classmethod
    def _positive_unique(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if any(n <= 0 for n in sizes) or len(set(sizes)) != len(sizes):
            raise ValueError("sizes must be positive and distinct")
        return tuple(sorted(sizes))


def load_drafter_settings() -> DrafterSettings:
    """The `[drafter]` table of the current catalog, validated (defaults where it is absent)."""
    return current().section(DrafterSettings)
