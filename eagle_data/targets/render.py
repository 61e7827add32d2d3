"""Render a conversation exactly as the target's chat template would, as pieces with loss-mask values.

A piece is a structural token id, or text that is later encoded with special-token parsing off. Spans
come from this structure, never from searching rendered text. Text is cut where the prompt ends and
the model's own tokens begin (the target tokenized the prompt alone, then generated), so BPE never
merges across that boundary; elsewhere adjacent text is one piece, as a server tokenizes a prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle_data.targets.profile import TargetError
from eagle_data.targets.target import Part, Target, Template


@dataclass(frozen=True, slots=True)
class Reply:
    """An earlier regenerated assistant turn, for token accounting: where its tokens sit in the pieces,
    the reasoning the template left out of them, and how many tokens the engine returned for it."""

    start: int  # pieces[start:end] is the turn as rendered
    end: int
    dropped: str  # reasoning the template does not render in this turn ("" when kept or none)
    output_len: int | None  # len(output_ids) when the engine returned its own ids


@dataclass(slots=True)
class Rendered:
    """Pieces and their mask values; indices mark the final turn and every turn that must close."""

    pieces: list[int | str] = field(default_factory=list)
    masks: list[int] = field(default_factory=list)
    prompt_end: int = 0  # pieces[:prompt_end] is the final turn's generation prompt
    body_end: int = 0  # pieces[prompt_end:body_end] is the final turn as the model wrote it
    closed: list[int] = field(default_factory=list)  # piece index just past each trained turn's end-of-turn
    history: list[Reply] = field(default_factory=list)  # the regenerated turns before the final one
    _cut: bool = True

    def add(self, parts: Iterable[Part], mask: int) -> None:
        for part in parts:
            if isinstance(part, int):
                self.pieces.append(part)
                self.masks.append(mask)
            elif part:
                if not self._cut and self.masks[-1] == mask and isinstance(self.pieces[-1], str):
                    self.pieces[-1] += part
                else:
                    self.pieces.append(part)
                    self.masks.append(mask)
            else:
                continue
            self._cut = False

    def cut(self) -> None:
        """The next text starts a new piece (the prompt ends here)."""
        self._cut = True


def render(
    tpl: Template,
    messages: Sequence[dict[str, Any]],
    *,
    thinking: bool,
    truncated: bool = False,
    mask_empty_think: bool = False,
    generation_prompt: bool = False,
) -> Rendered:
    """The conversation as the template renders it, ending with the final assistant turn.

    With `generation_prompt`, `messages` is the prompt and the result ends where the model starts
    writing. An assistant turn is trained (mask 1) when it is the final one or was regenerated (has a
    `reasoning` or `output_ids` field); a truncated final turn gets no end-of-turn token.
    """
    msgs = _placed_system(tpl, messages)
    if not generation_prompt:
        if not msgs or msgs[-1]["role"] != "assistant":
            raise TargetError("conversation does not end with an assistant turn")
        final = msgs.pop()
    last_query = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    out = Rendered()
    out.add(tpl.bos, 0)
    for i, msg in enumerate(msgs):
        role = msg["role"]
        if role not in tpl.header:
            raise TargetError(f"unsupported role {role!r} (expected system, user or assistant)")
        if role == "assistant":
            _history_turn(out, tpl, msg, after_query=i > last_query, mask_empty_think=mask_empty_think)
        else:
            out.add((*tpl.header[role], msg["content"], *tpl.user_end, *tpl.after_turn), 0)
    out.add(tpl.header["assistant"], 0)
    if not thinking:
        out.add((*tpl.think_open, *tpl.think_close, *tpl.think_tail), 0)
    elif tpl.prompt_opens_think:
        out.add(tpl.think_open, 0)
    out.cut()
    out.prompt_end = len(out.pieces)
    if generation_prompt:
        out.body_end = out.prompt_end
        return out
    content = _reply(tpl, final)
    if thinking:
        reasoning = (final.get("reasoning") or "").strip(tpl.strip_reasoning)
        mask = 0 if mask_empty_think and not reasoning else 1
        if not tpl.prompt_opens_think:
            out.add(tpl.think_open, mask)
        out.add((reasoning,), mask)
        if not (truncated and not content):  # cut off while thinking: the block never closed
            out.add(tpl.think_close, mask)
            out.add(tpl.think_tail, 1)
    out.add((content.lstrip(tpl.strip_content_start),), 1)
    if not truncated:
        out.add((tpl.end_of_turn,), 1)
        out.closed.append(len(out.pieces))
    out.body_end = len(out.pieces)
    if not truncated:
        out.add(tpl.after_turn, 0)
    return out


def _history_turn(
    out: Rendered, tpl: Template, msg: dict[str, Any], *, after_query: bool, mask_empty_think: bool
) -> None:
    """An earlier assistant turn: reasoning kept only after the last user query, as the templates do."""
    trained = int(msg.get("reasoning") is not None or msg.get("output_ids") is not None)
    reasoning = (msg.get("reasoning") or "").strip(tpl.strip_reasoning)
    content = _reply(tpl, msg)
    out.add(tpl.header["assistant"], 0)
    if trained:
        out.cut()
    start = len(out.pieces)
    if after_query and reasoning:
        out.add((*tpl.think_open, reasoning, *tpl.think_close), trained)
        out.add(tpl.think_tail, trained)
        content = content.lstrip(tpl.strip_content_start)
    elif tpl.history_think == "empty":
        out.add((*tpl.think_open, *tpl.think_close), 0 if mask_empty_think else trained)
        out.add(tpl.think_tail, trained)
    out.add((content, tpl.end_of_turn), trained)
    if trained:
        out.closed.append(len(out.pieces))
        dropped = "" if after_query else reasoning
        ids = msg.get("output_ids")
        out.history.append(Reply(start, len(out.pieces), dropped, None if ids is None else len(ids)))
    out.add(tpl.after_turn, 0)


def _text(tpl: Template, msg: dict[str, Any]) -> str:
    """A message's content as the template writes it."""
    text = msg["content"] or ""
    return text.strip() if tpl.trim_content else text


def _reply(tpl: Template, msg: dict[str, Any]) -> str:
    return _text(tpl, msg).rstrip(tpl.rstrip_reply) if tpl.rstrip_reply else _text(tpl, msg)


def _placed_system(tpl: Template, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with user and system text as the template writes it, the system text where the template
    puts it: the default system message when none is given, the preamble opening an always-present system
    turn, or the system text joined to the last user message. Only a leading system message moves; a later
    one renders in place (own-turn formats only)."""
    msgs = [m if m["role"] == "assistant" else {**m, "content": _text(tpl, m)} for m in messages]
    given = msgs[0]["role"] == "system" if msgs else False
    if tpl.system_preamble:
        system = msgs.pop(0)["content"] if given else ""
        msgs.insert(0, {"role": "system", "content": tpl.system_preamble + system})
    elif tpl.default_system and not given:
        msgs.insert(0, {"role": "system", "content": tpl.default_system})
    if tpl.system_in == "own_turn":
        return msgs
    system = msgs.pop(0)["content"] if given else ""
    if any(m["role"] == "system" for m in msgs):
        raise TargetError("a system message after the first one has no place in this target's chat format")
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    if system and users:
        last = msgs[users[-1]]
        msgs[users[-1]] = {**last, "content": system + tpl.system_join + last["content"]}
    return msgs


def prompt_ids(target: Target, messages: Sequence[dict[str, Any]], *, thinking: bool) -> list[int]:
    """A profile's generation prompt ids as the target's server builds them (for engines fed token ids); any
    target's: `target.prompt_ids`."""
    target.check_thinking(thinking)
    rendered = render(target.template, messages, thinking=thinking, generation_prompt=True)
    ids: list[int] = []
    for piece in rendered.pieces[: rendered.prompt_end]:
        ids.extend(
            [piece] if isinstance(piece, int) else target.text_encoder.encode(piece, add_special_tokens=False).ids
        )
    return ids


def prompt_ids_match(target: Any, messages: Sequence[dict[str, Any]], ids: Sequence[int], *, thinking: bool) -> bool:
    """Whether the prompt ids a server reports it used equal our rendering of the same prompt (a server with
    another chat template, or one that parsed control-token text in user input, differs)."""
    return list(ids) == target.prompt_ids(list(messages), thinking=thinking)


SHOWN_TOKENS = 4  # tokens a prompt difference shows from each side


def prompt_difference(target: Any, messages: Sequence[dict[str, Any]], ids: Sequence[int], *, thinking: bool) -> str:
    """Where the prompt ids a server reports for `messages` first part from our rendering, in words, showing the
    next few tokens of each side ("" when they are equal). `target`: a profile's or a checkpoint's."""
    ours, theirs = target.prompt_ids(list(messages), thinking=thinking), list(ids)
    if theirs == ours:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), min(len(theirs), len(ours)))

    def shown(side: list[int]) -> str:
        window = side[at : at + SHOWN_TOKENS]
        return repr(target.decode(window)) if window else "end of prompt"

    return (f"first difference at token {at} of {len(ours)} (server {shown(theirs)}, ours {shown(ours)}; "
            f"the server's prompt is {len(theirs)} tokens)")
