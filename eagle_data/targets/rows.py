"""Generations -> token ids, loss masks and per-row verification for one target (frame in, frame out).

All text pieces of a frame are encoded in one `encode_batch` call (each distinct piece once), so the
cost stays close to raw tokenization of the rendered texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from eagle_data.targets.profile import TargetError
from eagle_data.targets.render import Rendered, render
from eagle_data.targets.target import Target

MESSAGE_DTYPE = pl.Struct(
    {"role": pl.String, "content": pl.String, "reasoning": pl.String, "output_ids": pl.List(pl.Int32)}
)  # one turn of `messages` (types.Message); reasoning/output_ids are null on turns not regenerated
NOT_BUILT = ("failed", "skipped_budget")  # no reply to train on; the quality room decides verdicts
PASS_THROUGH = (
    "dataset",
    "status",
    "finish_reason",
    "completion_tokens",
    "reasoning_tokens",
    "content",
    "reasoning",
    "model",
    "engine",
    "config_hash",
    "provider",
    "served_model",
    "sampling",
    "sampling_setting",
    "prompt_tokens",  # what the server counted, against `rendered_prompt_tokens`
    "messages",  # the conversations export (SpecForge JSONL) reads it
    "error",  # why a failed row failed (`empty_reply: ...`): the quality gates name the cause
    "sampled_logprobs",  # what the engine reported of its sampled tokens (quality/sampled.py): metadata, report
)
FLAGS = ("roundtrip_ok", "prefix_ok", "structure_ok", "eot_ok")
OUTPUT_COLUMNS: dict[str, Any] = {  # built here; then PASS_THROUGH columns follow
    "input_ids": pl.List(pl.Int32),
    "loss_mask": pl.List(pl.UInt8),
    "num_tokens": pl.Int32,
    "loss_tokens": pl.Int32,
    **dict.fromkeys(FLAGS, pl.Boolean),
    "special_in_text": pl.Int32,
    "ids_match": pl.Boolean,
    "prompt_ok": pl.Boolean,
    "target_error": pl.String,
    "reply_tokens": pl.Int32,
    "reply_turns": pl.Int32,
    "rendered_prompt_tokens": pl.Int64,
    "vocab_ok": pl.Boolean,
}


@dataclass(slots=True)
class _Row:
    """One conversation, rendered in full and as the final turn's generation prompt."""

    full: Rendered
    prompt: Rendered
    output_ids: list[int] | None
    truncated: bool
    server_prompt: list[int] | None  # the final turn's prompt ids as the server reported rendering them
    earlier_prompts: list[Rendered]  # the generation prompt of each earlier regenerated turn


def build_training_rows(
    target: Target, generations: pl.DataFrame, *, thinking: bool, mask_empty_think: bool = False
) -> pl.DataFrame:
    """Token ids, loss mask and verification flags per generation row, by the target's own builder (a profile's
    pieces here, or a checkpoint's template in targets.derived); the same columns either way."""
    return target.training_rows(generations, thinking=thinking, mask_empty_think=mask_empty_think)


def profile_rows(
    target: Target, generations: pl.DataFrame, *, thinking: bool, mask_empty_think: bool = False
) -> pl.DataFrame:
    """Token ids, loss mask and verification flags per generation row, rendered from a profile's pieces.

    `generations` follows the generation contract (docs/design.md) with `messages` holding the conversation
    including the regenerated assistant turns. Rows with status failed/skipped_budget get empty lists and
    null flags; a conversation the template cannot render gets empty lists, false flags and `target_error`.

    roundtrip_ok: decoding the ids gives the rendered text. prefix_ok: the ids before the final turn equal
    its generation prompt rendered and tokenized alone. structure_ok: control ids only where the template
    puts them (none from text, none stray in the engine's ids). eot_ok: each trained assistant turn ends
    with the end-of-turn id (a truncated final turn excepted). special_in_text: control-token strings in
    user or model text, kept as plain text. ids_match: the engine's `output_ids` for the final turn equal
    the text reconstruction (null without them); when they differ, the engine's ids are used, all trained.
    prompt_ok: the prompt ids the server reports it used (`prompt_ids`, e.g. vLLM's `return_token_ids`) equal
    our rendering of the final turn's prompt (null without them): a server with another chat template, or one
    that parsed control-token text in user input, differs.
    reply_tokens: the tokens of every regenerated turn as rebuilt here (a turn's own engine ids where the
    engine returned them; reasoning a template leaves out of earlier turns encoded apart), over
    `reply_turns` turns: the quality room weighs them against the engine's reported completion tokens.
    rendered_prompt_tokens: the generation prompt of every regenerated turn, rendered and tokenized here, summed:
    the quality room weighs it against the server's reported `prompt_tokens` (another vocabulary or template
    counts otherwise). vocab_ok: every id is a row of the target's embedding.
    """
    target.check_thinking(thinking)
    statuses = generations["status"].to_list()
    reasons = generations["finish_reason"].to_list() if "finish_reason" in generations.columns else None
    row_out_ids = generations["output_ids"].to_list() if "output_ids" in generations.columns else None
    server_prompts = generations["prompt_ids"].to_list() if "prompt_ids" in generations.columns else None
    rows: list[_Row | str | None] = []
    for i, messages in enumerate(generations["messages"].to_list()):
        if statuses[i] in NOT_BUILT:
            rows.append(None)
            continue
        truncated = statuses[i] == "truncated" or (reasons is not None and reasons[i] == "length")
        try:
            row = _render_row(target, messages, thinking, truncated, mask_empty_think, row_out_ids, i)
            server = None if server_prompts is None else server_prompts[i]
            row.server_prompt = None if server is None else list(server)
            rows.append(row)
        except TargetError as exc:
            rows.append(str(exc))
    columns = _Encoder(target, rows).columns()
    out = pl.DataFrame(
        [generations["prompt_id"], *(pl.Series(k, v, dtype=OUTPUT_COLUMNS[k]) for k, v in columns.items())]
    )
    return out.with_columns(generations.select([c for c in PASS_THROUGH if c in generations.columns]))


def _render_row(
    target: Target,
    messages: list[dict[str, Any]],
    thinking: bool,
    truncated: bool,
    mask_empty_think: bool,
    row_out_ids: list[Any] | None,
    i: int,
) -> _Row:
    tpl = target.template
    full = render(tpl, messages, thinking=thinking, truncated=truncated, mask_empty_think=mask_empty_think)
    prompt = render(tpl, messages[:-1], thinking=thinking, generation_prompt=True)
    earlier = [
        render(tpl, messages[:k], thinking=thinking, generation_prompt=True)
        for k, m in enumerate(messages[:-1])
        if m["role"] == "assistant" and (m.get("reasoning") is not None or m.get("output_ids") is not None)
    ]
    out_ids = messages[-1].get("output_ids")
    if out_ids is None and row_out_ids is not None:
        out_ids = row_out_ids[i]  # the row-level column holds the same turn's tokens
    return _Row(full, prompt, None if out_ids is None else list(out_ids), truncated, None, earlier)


def unbuilt(row: str | None) -> dict[str, Any]:
    """A row with no ids: null flags when the status had no reply, false flags when rendering failed."""
    flag = None if row is None else False
    empty = {"input_ids": [], "loss_mask": [], "num_tokens": 0, "loss_tokens": 0, "special_in_text": 0}
    unknown = dict.fromkeys(("ids_match", "prompt_ok", "reply_tokens", "reply_turns", "rendered_prompt_tokens"))
    return {**empty, **dict.fromkeys(FLAGS, flag), **unknown, "vocab_ok": None, "target_error": row or ""}


class _Encoder:
    """Encodes every distinct text piece once, then assembles and verifies each row."""

    def __init__(self, target: Target, rows: list[_Row | str | None]) -> None:
        self.target = target
        self.rows = rows
        index: dict[str, int] = {}
        for row in rows:
            if isinstance(row, _Row):
                for piece in [*row.full.pieces, *(p for r in row.earlier_prompts for p in r.pieces)]:
                    if type(piece) is str:
                        index.setdefault(piece, len(index))
                for turn in row.full.history:
                    if turn.dropped and turn.output_len is None:  # counted, never part of the ids
                        index.setdefault(turn.dropped, len(index))
        self.index = index
        texts = list(index)
        self.encoded = [e.ids for e in target.text_encoder.encode_batch(texts, add_special_tokens=False)]
        control = set(target.token_text)
        self.control = control
        low = min(control, default=0)  # control ids sit above the BPE ids: max() rules most pieces out fast
        self.dirty = [bool(ids) and max(ids) >= low and not control.isdisjoint(ids) for ids in self.encoded]
        self.specials = [len(target.control_pattern.findall(t)) for t in texts]

    def ids(self, pieces: list[Any], masks: list[int]) -> tuple[list[int], list[int], list[int]]:
        """Token ids, mask and the token offset where each piece ends."""
        ids: list[int] = []
        mask: list[int] = []
        ends: list[int] = []
        for piece, m in zip(pieces, masks, strict=True):
            if type(piece) is int:
                ids.append(piece)
                mask.append(m)
            else:
                toks = self.encoded[self.index[piece]] if type(piece) is str else piece
                ids += toks
                mask += [m] * len(toks)
            ends.append(len(ids))
        return ids, mask, ends

    def columns(self) -> dict[str, list[Any]]:
        """Every output column, one value per input row."""
        built = [n for n, row in enumerate(self.rows) if isinstance(row, _Row)]
        records = [self._row(row) if isinstance(row, _Row) else unbuilt(row) for row in self.rows]
        for n, back in zip(built, self._decode([records[n]["input_ids"] for n in built]), strict=True):
            records[n]["roundtrip_ok"] = back == records[n].pop("text")
        return {name: [r[name] for r in records] for name in OUTPUT_COLUMNS}

    def _row(self, row: _Row) -> dict[str, Any]:
        full, eot = row.full, self.target.eot_id
        pieces, masks, closed, body_end = full.pieces, full.masks, full.closed, full.body_end
        dirty = any(self.dirty[self.index[p]] for p in pieces if type(p) is str)
        ids_match = None
        control_ok = True
        if row.output_ids is not None:
            body = pieces[full.prompt_end : full.body_end]
            text_ids = self.ids(body, masks[full.prompt_end : full.body_end])[0]
            out = row.output_ids
            if not row.truncated and (not out or out[-1] not in self.control):
                out = [*out, eot]  # the engine reported a stop but left the stop token out of the ids
            ids_match = out == text_ids
            if not ids_match:  # the model's own tokens win; their control ids must sit where the template's do
                control_ok = [t for t in out if t in self.control] == [p for p in body if type(p) is int]
                shift = full.body_end - full.prompt_end - 1
                pieces = [*pieces[: full.prompt_end], out, *pieces[full.body_end :]]
                masks = [*masks[: full.prompt_end], 1, *masks[full.body_end :]]
                closed = [c if c <= full.prompt_end else c - shift for c in closed]
                body_end = full.prompt_end + 1
        ids, mask, ends = self.ids(pieces, masks)
        prompt_len = ends[full.prompt_end - 1] if full.prompt_end else 0
        reply_tokens = (ends[body_end - 1] if body_end else 0) - prompt_len + self._history_tokens(full, ends)
        prompt = row.prompt
        apart = None if prompt.pieces == full.pieces[: full.prompt_end] else self._encode_apart(prompt)
        prefix_ok = apart is None or ids[:prompt_len] == apart  # the same pieces encode to the same ids
        prompt_ok = None
        if row.server_prompt is not None:
            prompt_ok = row.server_prompt == (ids[:prompt_len] if apart is None else apart)
        earlier = sum(len(self.ids(r.pieces, r.masks)[0]) for r in row.earlier_prompts)
        size = self.target.vocab_size
        return {
            "input_ids": ids,
            "loss_mask": mask,
            "num_tokens": len(ids),
            "loss_tokens": sum(mask),
            "roundtrip_ok": None,  # set after the batched decode, against "text"
            "prefix_ok": prefix_ok,
            "structure_ok": control_ok and not dirty,
            "eot_ok": all(ids[ends[c - 1] - 1] == eot for c in closed),
            "special_in_text": sum(self.specials[self.index[p]] for p in full.pieces if type(p) is str),
            "ids_match": ids_match,
            "prompt_ok": prompt_ok,
            "target_error": "",
            "reply_tokens": reply_tokens,
            "reply_turns": 1 + len(full.history),
            "rendered_prompt_tokens": (prompt_len if apart is None else len(apart)) + earlier,
            "vocab_ok": all(0 <= t < size for t in ids),
            "text": "".join(self.target.token_text[p] if type(p) is int else p for p in full.pieces),
        }

    def _history_tokens(self, full: Rendered, ends: list[int]) -> int:
        """Tokens of the earlier regenerated turns: the engine's count of its own ids, else the rendered
        turn plus the reasoning the template dropped from it (pieces before the final turn never move)."""
        total = 0
        for turn in full.history:
            if turn.output_len is not None:
                total += turn.output_len
                continue
            total += ends[turn.end - 1] - (ends[turn.start - 1] if turn.start else 0)
            if turn.dropped:
                total += len(self.encoded[self.index[turn.dropped]])
        return total

    def _decode(self, rows: list[list[int]]) -> list[str]:
        table = self.target.token_bytes
        if table is None:
            return self.target.text_encoder.decode_batch(rows, skip_special_tokens=False)
        return [b"".join(map(table.__getitem__, ids)).decode(errors="replace") for ids in rows]

    def _encode_apart(self, rendered: Rendered) -> list[int]:
        """Ids of a rendering whose pieces were not in the batch (only when the renderings disagree)."""
        enc = self.target.text_encoder
        return [
            t for p in rendered.pieces for t in ([p] if type(p) is int else enc.encode(p, add_special_tokens=False).ids)
        ]
