"""The files an export writes for trainers, as data: one `ExportFormat` per file, in `FORMATS` (pure).

A format says what its file holds and which trainer reads it, and renders a frame of exported rows into
that file's bytes. The tokenized formats hold the ids and loss masks the export verified, so a trainer
that reads them trains on exactly those tokens; the text formats hold conversations a trainer tokenizes
again with its own template (`eagle_data.exports.parity` measures how far that lands from ours).

`train.parquet` and `mix.parquet` are ours only: no trainer reads parquet (SpecForge and EAGLE read
JSON/JSONL); our own drafter inputs (`draft_vocab`, `hidden_states`) read the mix.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl

from eagle_data import provenance

TRAINING_SCHEMA: dict[str, pl.DataType] = {  # what train.parquet and the mix hold, in this order
    "prompt_id": pl.String(),
    "dataset": pl.String(),
    "input_ids": pl.List(pl.Int32),
    "loss_mask": pl.List(pl.UInt8),
    **{column: pl.String() for column in provenance.COLUMNS},
}
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}  # ShareGPT's `from` per role


def to_training_parquet(rows: pl.DataFrame) -> pl.DataFrame:
    """Token ids and loss masks, with how each row was made (eagle_data.provenance; null where a shard
    predates a column), in the exports' schema, ready to write as parquet."""
    return rows.select(
        (pl.col(name) if name in rows.columns else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in TRAINING_SCHEMA.items()
    )


def to_specforge_prompts(rows: pl.DataFrame) -> bytes:
    """SpecForge `data.prompts_path` rows: `input_ids` and `loss_mask` as verified, after the ids people
    filter on (`id`, `dataset`, the provenance columns); SpecForge reads the two lists and ignores the rest."""
    training = to_training_parquet(rows)
    out = io.BytesIO()
    training.select(
        pl.col("prompt_id").alias("id"), "dataset", *provenance.COLUMNS, "input_ids", "loss_mask"
    ).write_ndjson(out)
    return out.getvalue()


def _lines(records: Sequence[dict[str, object]]) -> bytes:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode()


def to_specforge_text(rows: pl.DataFrame) -> bytes:
    """{"id", "conversations": [{role, content, reasoning_content?}]}: the reasoning of assistant turns in
    `reasoning_content`, the field SpecForge's thinking parser and Qwen3's chat template read; never
    folded into content."""
    return _lines([
        {"id": prompt_id, "conversations": [
            {"role": m["role"], "content": m["content"]}
            | ({"reasoning_content": m["reasoning"] or ""} if m["role"] == "assistant" else {})
            for m in messages
        ]}
        for prompt_id, messages in rows.select("prompt_id", "messages").iter_rows()
    ])  # fmt: skip


def to_sharegpt(rows: pl.DataFrame) -> bytes:
    """EAGLE's ShareGPT rows: {"id", "conversations": [{from: system|human|gpt, value}]}; ShareGPT has no
    reasoning field, so reasoning is not carried (its parity counts those rows)."""
    return _lines([
        {"id": prompt_id,
         "conversations": [{"from": SHAREGPT_ROLES[m["role"]], "value": m["content"]} for m in messages]}
        for prompt_id, messages in rows.select("prompt_id", "messages").iter_rows()
    ])  # fmt: skip


@dataclass(frozen=True)
class ExportFormat:
    """One export file for a trainer.

    Attributes:
        name: the catalog's name for it (`[exports] formats`).
        file: its file name, under `{ds}/export/` (and `training_mix/training_mix/` when `mix`).
        holds: what one row holds.
        reader: which trainer reads it, and how it is pointed at it.
        render: exported rows -> the file's bytes (JSON lines).
        tokenized: True when the file holds our verified ids and masks (a trainer must load them as they
            are); False for text the trainer tokenizes itself.
        reasoning: whether the reasoning of assistant turns is carried.
        mix: also written for the whole mix, in mix order (needs only the training columns).
    """

    name: str
    file: str
    holds: str
    reader: str
    render: Callable[[pl.DataFrame], bytes]
    tokenized: bool
    reasoning: bool
    mix: bool


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat(
            "specforge_prompts", "prompts.jsonl", "id, dataset, provenance, input_ids, loss_mask (as verified)",
            "SpecForge: data.prompts_path (pre-tokenized, loaded as is)", to_specforge_prompts,
            tokenized=True, reasoning=True, mix=True,
        ),
        ExportFormat(
            "specforge_text", "conversations.jsonl", "id, conversations [{role, content, reasoning_content}]",
            "SpecForge: data.train_data_path (tokenized again by its chat template)", to_specforge_text,
            tokenized=False, reasoning=True, mix=False,
        ),
        ExportFormat(
            "eagle_sharegpt", "sharegpt.jsonl", "id, conversations [{from, value}] (no reasoning)",
            "EAGLE (SafeAILab) ShareGPT data; SpecForge's loader reads from/value too", to_sharegpt,
            tokenized=False, reasoning=False, mix=False,
        ),
    )
}  # fmt: skip
DEFAULT_FORMATS = ("specforge_prompts",)


def chosen(names: Sequence[str]) -> tuple[ExportFormat, ...]:
    """The formats named in the catalog, in the registry's order; an unknown name is a one-line error."""
    unknown = sorted(set(names) - set(FORMATS))
    if unknown:
        raise ValueError(f"[exports] formats: unknown {', '.join(unknown)}; known: {', '.join(FORMATS)}")
    return tuple(f for name, f in FORMATS.items() if name in names)
