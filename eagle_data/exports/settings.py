"""The catalog's `[exports]` table: which trainer files the export writes, and how its parity check samples."""

from __future__ import annotations

from pydantic import Field, field_validator

from eagle_data.catalog import Section, current
from eagle_data.exports.formats import DEFAULT_FORMATS, FORMATS, chosen


class ExportSettings(Section):
    """The catalog's `[exports]` table. Attributes:
    formats: the trainer files written per dataset (and for the mix, where the format allows):
        names in `exports.formats.FORMATS`.
    parity_rows: rows per exported file the `trainer_parity` check runs the trainer's own loader or
        template on, drawn evenly with a fixed seed; 0: every row.
    specforge_template: SpecForge's `data.chat_template` for the text formats' parity; "" picks it from
        the target's chat format and thinking setting (`exports.parity.SPECFORGE_TEMPLATES`).
    trainer_tokenizer: the local transformers folder SpecForge loads the tokenizer from (its
        `model.target_model_path`), for the text formats' parity; "" means $EAGLE_DATA_CAPTURE_CHECKPOINT,
        or on the demo profile the demo model.
    """

    TABLE = "exports"

    formats: tuple[str, ...] = DEFAULT_FORMATS
    parity_rows: int = Field(1000, ge=0)
    specforge_template: str = ""
    trainer_tokenizer: str = ""

    @field_validator("formats")
    @classmethod
    def _known(cls, formats: tuple[str, ...]) -> tuple[str, ...]:
        if not formats:  # an export of nothing would still set the last one's files aside: refused, not green
            raise ValueError(f"[exports] formats = []: choose at least one of {', '.join(FORMATS)}")
        chosen(formats)
        return formats


def export_settings() -> ExportSettings:
    """`[exports]` of the current catalog (the user's file merged over the packaged one), validated."""
    return current().section(ExportSettings)
