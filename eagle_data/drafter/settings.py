"""The catalog's `[drafter]` table: draft vocabulary sizes and the other drafter-input settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eagle_data.catalog import CATALOG_PATH, CatalogError, read_table


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BenchmarkSource(_Frozen):
    """One benchmark's items. Attributes:
    fields: the item fields holding text (a list-of-strings field counts each string as an item text).
    package, resource: an installed package that ships the items, and the JSONL (.gz) file inside it;
        read offline.
    hub_id, config, split: the dataset on the hub (its parquet branch); read only with `use_hub`.
    """

    fields: tuple[str, ...] = Field(min_length=1)
    package: str | None = None
    resource: str | None = None
    hub_id: str | None = None
    config: str = "default"
    split: str = "test"

    @model_validator(mode="after")
    def _somewhere(self) -> BenchmarkSource:
        if (self.package is None) != (self.resource is None):
            raise ValueError("set package and resource together")
        if self.package is None and self.hub_id is None:
            raise ValueError("set package/resource or hub_id")
        return self


class Decontamination(_Frozen):
    """Attributes:
    ngram: the word window of the overlap test (13: the usual decontamination window).
    folder: a folder of the user's benchmark files, one benchmark per file named after it
        (`{name}.jsonl`, `.jsonl.gz` or `.parquet`), the text in `text_field`; "" for none.
    use_hub: also read the benchmarks that name a `hub_id` from the hub (needs the network).
    benchmarks: the named benchmarks (packaged and hub).
    """

    ngram: int = Field(13, ge=2)
    folder: str = ""
    text_field: str = "text"
    use_hub: bool = False
    benchmarks: dict[str, BenchmarkSource] = {}


class HiddenStateRecipe(_Frozen):
    """How a drafter's offline training captures the target's hidden states, to size the capture.

    Attributes:
    captured_layers: hidden-state tensors stored per token (EAGLE-3: three auxiliary layers + the last).
    hidden_size: the target model's hidden size (Qwen3-8B: 4096).
    dtype: bf16 (2 bytes a value) or fp8 (1 byte a value plus one float32 scale per token and layer,
        speculators' per-token format).
    target_params_b: the target's parameters in billions; a forward pass costs 2 FLOPs per parameter a token.
    gpu_tflops: dense bf16 TFLOP/s of one GPU (H100 SXM: 989).
    mfu: the share of that the capture achieves (prefill only; 0.4 is a planning figure, measure yours).
    """

    captured_layers: int = Field(4, gt=0)
    hidden_size: int = Field(4096, gt=0)
    dtype: Literal["bf16", "fp8"] = "bf16"
    target_params_b: float = Field(8.0, gt=0)
    gpu_tflops: float = Field(989.0, gt=0)
    mfu: float = Field(0.4, gt=0, le=1)


class DrafterSettings(_Frozen):
    """Attributes:
    draft_vocab_sizes: one EAGLE-3 draft vocabulary mapping is written per size (top-N supervised tokens).
    decontamination: which benchmarks rows are checked against.
    hidden_states: the capture recipe the hidden-state plan sizes.
    """

    draft_vocab_sizes: tuple[int, ...] = Field((32_000, 64_000), min_length=1)
    decontamination: Decontamination = Decontamination()
    hidden_states: HiddenStateRecipe = HiddenStateRecipe()

    @field_validator("draft_vocab_sizes")
    @classmethod
    def _positive_unique(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if any(n <= 0 for n in sizes) or len(set(sizes)) != len(sizes):
            raise ValueError("sizes must be positive and distinct")
        return tuple(sorted(sizes))


def load_drafter_settings(path: Path = CATALOG_PATH) -> DrafterSettings:
    """The `[drafter]` table of the catalog file, validated (defaults where it is absent)."""
    try:
        return DrafterSettings(**read_table(path, "drafter"))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"[drafter] {where}: {first['msg']} (fix {path})") from exc
