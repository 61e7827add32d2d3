"""The catalog's `[drafter]` table: draft vocabulary sizes and the other drafter-input settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from eagle_data.catalog import CATALOG_PATH, CatalogError, read_table


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DrafterSettings(_Frozen):
    """Attributes:
    draft_vocab_sizes: one EAGLE-3 draft vocabulary mapping is written per size (top-N supervised tokens).
    """

    draft_vocab_sizes: tuple[int, ...] = Field((32_000, 64_000), min_length=1)

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
