"""A target derived from the model's own checkpoint: its tokenizer and chat template define every id and mask.

`target = "auto"` (or `"checkpoint:<folder or hub id>"`) renders each conversation with the checkpoint's own
template (transformers `apply_chat_template`, thinking through the template's own `enable_thinking` switch) and
tokenizes it as a server does (special tokens parsed). Spans come from render boundaries, never from searching
the text: an assistant turn starts where its generation prompt (the conversation before it, rendered with the
generation prompt) stops agreeing with the whole conversation's rendering, and ends at the first end-of-turn
token after that. The final reply is the engine's own ids where it returned them. The hand-written profiles of
targets.toml stay as verified presets (test_targets_derived holds the two equal row by row).
"""

from __future__ import annotations

import hashlib
import json
import re
from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl
from tokenizers import Tokenizer

from eagle_data import settings
from eagle_data.checkpoints import CheckpointError, checkpoint_folder
from eagle_data.targets.profile import CHECKPOINT, TOKENIZER_ENV, TargetError
from eagle_data.targets.rows import NOT_BUILT, OUTPUT_COLUMNS, PASS_THROUGH, unbuilt
from eagle_data.targets.tokenizer import text_encoder

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_SPECIAL_LOOKING = re.compile(r"<\|[^|<>\s]{1,64}\|>")  # `<|im_start|>`-shaped strings in template text


@dataclass(frozen=True, slots=True)
class _Span:
    start: int  # character offsets in the rendered text
    end: int


class DerivedTarget:
    """A checkpoint's tokenizer and chat template as a target (the same surface as a profile's `Target`)."""

    def __init__(self, ref: str, folder: Path, hf_tokenizer: Any) -> None:
        self.ref, self.folder, self.hf = ref, folder, hf_tokenizer
        self.tokenizer: Tokenizer = hf_tokenizer.backend_tokenizer
        added = self.tokenizer.get_added_tokens_decoder()
        self.token_text = {i: t.content for i, t in added.items()}
        self.control = frozenset(self.token_text)
        strings = sorted(self.token_text.values(), key=len, reverse=True)
        self.control_pattern = re.compile("|".join(re.escape(t) for t in strings) or "(?!)")
        self.template_text: str = hf_tokenizer.chat_template
        self.eot_ids = _end_ids(folder, hf_tokenizer)
        self._check_template()

    @property
    def name(self) -> str:
        return CHECKPOINT + self.ref

    @property
    def eot_id(self) -> int:
        return self.eot_ids[0]

    @cached_property
    def vocab_size(self) -> int:
        """The model's embedding rows (config.json `vocab_size`), else the tokenizer's size."""
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        config = self.folder / "config.json"
        if config.is_file():
            data = json.loads(config.read_text())
            declared = data.get("vocab_size") or data.get("text_config", {}).get("vocab_size")
            if isinstance(declared, int) and declared >= size:
                return declared
        return size

    @cached_property
    def text_encoder(self) -> Tokenizer:
        return text_encoder(self.tokenizer)

    @cached_property
    def tokenizer_hash(self) -> str:
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()

    @property
    def chat_template_hash(self) -> str:
        return hashlib.sha256(self.template_text.encode()).hexdigest()

    @cached_property
    def think_ids(self) -> frozenset[int]:
        """The think-block markers' ids, where the template writes them and the vocabulary has them."""
        ids = [self.tokenizer.token_to_id(t) for t in (THINK_OPEN, THINK_CLOSE)]
        if None in ids or THINK_OPEN not in self.template_text:
            return frozenset()
        return frozenset(i for i in ids if i is not None)

    def check_thinking(self, thinking: bool) -> None:
        if thinking and not self.think_ids:
            raise TargetError(
                f"target {self.name}: its chat template writes no think block, so thinking cannot be on; "
                "set generation.thinking = false for this dataset in the catalog"
            )

    # -- rendering -------------------------------------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], *, thinking: bool, generation_prompt: bool) -> str:
        try:
            return self.hf.apply_chat_template(
                [_hf_message(m) for m in messages], tokenize=False, add_generation_prompt=generation_prompt,
                enable_thinking=thinking,
            )  # fmt: skip
        except Exception as exc:  # a template's own `raise_exception` (e.g. roles must alternate) and Jinja errors
            raise TargetError(f"target {self.name}: the chat template refused the conversation: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None

    def prompt_ids(self, messages: list[dict[str, Any]], *, thinking: bool) -> list[int]:
        """The generation prompt's ids, exactly as `apply_chat_template(..., tokenize=True)` gives them."""
        self.check_thinking(thinking)
        return self.tokenizer.encode(self.render(messages, thinking=thinking, generation_prompt=True),
                                     add_special_tokens=False).ids  # fmt: skip

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _check_template(self) -> None:
        """Refuse, before any request, a template whose turn has no end token of the tokenizer, or whose own
        special-looking strings the tokenizer does not hold as single tokens."""
        probe = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
        thinking = bool(self.think_ids)
        text = self.render(probe, thinking=thinking, generation_prompt=False)
        outside = text.replace("Hi.", "\0").replace("Hello.", "\0")
        for token in sorted(set(_SPECIAL_LOOKING.findall(outside))):
            if self.tokenizer.token_to_id(token) is None:
                raise TargetError(f"target {self.name}: the chat template writes {token!r}, which the tokenizer "
                                  "does not have as a token; use the tokenizer the model was trained with")  # fmt: skip
        start = _common(text, self.render(probe[:1], thinking=thinking, generation_prompt=True))
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        if _end_of_turn(encoding.ids, encoding.offsets, start, self.eot_ids) is None:
            names = [self.token_text.get(i, str(i)) for i in self.eot_ids]
            raise TargetError(f"target {self.name}: the chat template closes an assistant turn with none of the "
                              f"model's end tokens {names}; fix generation_config.json's eos_token_id")  # fmt: skip

    # -- training rows ---------------------------------------------------------------------------------------

    def training_rows(
        self, generations: pl.DataFrame, *, thinking: bool, mask_empty_think: bool = False
    ) -> pl.DataFrame:
        """The validated contract's columns (targets.rows.OUTPUT_COLUMNS) per generation row."""
        self.check_thinking(thinking)
        statuses = generations["status"].to_list()
        reasons = generations["finish_reason"].to_list() if "finish_reason" in generations.columns else None
        row_ids = generations["output_ids"].to_list() if "output_ids" in generations.columns else None
        servers = generations["prompt_ids"].to_list() if "prompt_ids" in generations.columns else None
        records = []
        for i, messages in enumerate(generations["messages"].to_list()):
            if statuses[i] in NOT_BUILT:
                records.append(unbuilt(None))
                continue
            truncated = statuses[i] == "truncated" or (reasons is not None and reasons[i] == "length")
            out_ids = messages[-1].get("output_ids") if messages else None
            if out_ids is None and row_ids is not None:
                out_ids = row_ids[i]
            server = None if servers is None or servers[i] is None else list(servers[i])
            try:
                records.append(self._row(messages, thinking, truncated, mask_empty_think, out_ids, server))
            except TargetError as exc:
                records.append(unbuilt(str(exc)))
        columns = {name: pl.Series(name, [r[name] for r in records], dtype=dtype)
                   for name, dtype in OUTPUT_COLUMNS.items()}  # fmt: skip
        out = pl.DataFrame([generations["prompt_id"], *columns.values()])
        return out.with_columns(generations.select([c for c in PASS_THROUGH if c in generations.columns]))

    def _row(
        self,
        messages: list[dict[str, Any]],
        thinking: bool,
        truncated: bool,
        mask_empty_think: bool,
        output_ids: list[int] | None,
        server_prompt: list[int] | None,
    ) -> dict[str, Any]:
        if not messages or messages[-1]["role"] != "assistant":
            raise TargetError("conversation does not end with an assistant turn")
        final = len(messages) - 1
        trained = [k for k, m in enumerate(messages) if m["role"] == "assistant"
                   and (k == final or m.get("reasoning") is not None or m.get("output_ids") is not None)]  # fmt: skip
        full = self.render(messages, thinking=thinking, generation_prompt=False)
        prompts = {k: self.render(messages[:k], thinking=thinking, generation_prompt=True) for k in trained}
        prompt = prompts[final]
        encode = self.tokenizer.encode
        head = encode(prompt, add_special_tokens=False)
        ids, mask = list(head.ids), [0] * len(head.ids)
        for k in trained[:-1]:  # earlier regenerated turns, where the final prompt renders them
            span = self._span(prompt, head.ids, head.offsets, prompts[k])
            starts = [s for s, _ in head.offsets]
            for t in range(bisect_left(starts, span.start), bisect_left(starts, span.end)):
                mask[t] = 1
        prefix_ok = full.startswith(prompt)
        if prefix_ok or output_ids is None:
            reply = self._span(full, None, None, prompt)
            body_text = full[reply.start : reply.end if not truncated else self._eot_start(full, reply)]
            tail_text = "" if truncated else full[reply.end :]
            text_ids: list[int] | None = encode(body_text, add_special_tokens=False).ids
        else:
            # The template renders the prompt otherwise once the reply follows it (Mistral Nemo's drops the system
            # message then): the row is what the model saw, its prompt and its own ids, then the template's text
            # after the conversation's last end token.
            text_ids, body_text, prefix_ok = None, self.decode(output_ids), True
            tail_text = "" if truncated else full[self._last_end(full) :]
        ids_match, control_ok, body = None, True, text_ids or []
        if output_ids is not None:
            out = list(output_ids)
            if not truncated and (not out or out[-1] not in self.control):
                out.append(self.eot_id)  # the engine reported a stop but left the stop token out of its ids
            if text_ids is not None:
                ids_match = out == text_ids
                if not ids_match:  # the model's own tokens win; their control ids must be where the template's are
                    control_ok = [t for t in out if t in self.control] == [t for t in text_ids if t in self.control]
            body = out
        body_mask = self._body_mask(body, thinking, mask_empty_think, messages[-1])
        tail = encode(tail_text, add_special_tokens=False).ids if tail_text else []
        ids += [*body, *tail]
        mask += [*body_mask, *[0] * len(tail)]
        contents = [m["content"] or "" for m in messages] + [m.get("reasoning") or "" for m in messages]
        specials = sum(len(self.control_pattern.findall(text)) for text in contents)
        history = sum(self._history_tokens(m, prompt) for k, m in enumerate(messages) if k in trained[:-1])
        return {
            "input_ids": ids,
            "loss_mask": mask,
            "num_tokens": len(ids),
            "loss_tokens": sum(mask),
            "roundtrip_ok": self.decode(ids) == prompt + body_text + tail_text,
            "prefix_ok": prefix_ok,
            "structure_ok": control_ok,
            "eot_ok": truncated or (bool(body) and body[-1] in self.eot_ids),
            "special_in_text": specials,
            "ids_match": ids_match,
            "prompt_ok": None if server_prompt is None else server_prompt == list(head.ids),
            "target_error": "",
            "reply_tokens": len(body) + history,
            "reply_turns": len(trained),
            "rendered_prompt_tokens": sum(len(encode(p, add_special_tokens=False).ids) for p in prompts.values()),
            "vocab_ok": not ids or (min(ids) >= 0 and max(ids) < self.vocab_size),
        }

    def _last_end(self, text: str) -> int:
        """The character offset just past the last end token of `text` (0 when it has none)."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ends = [stop for token, (_, stop) in zip(encoding.ids, encoding.offsets, strict=True) if token in self.eot_ids]
        return ends[-1] if ends else len(text)

    def _span(self, text: str, ids: list[int] | None, offsets: list[tuple[int, int]] | None, before: str) -> _Span:
        """Where a turn sits in `text`: from where `before` (its generation prompt) stops agreeing with `text`, to
        the end of the first end-of-turn token after that."""
        start = _common(text, before)
        if ids is None or offsets is None:
            encoding = self.tokenizer.encode(text, add_special_tokens=False)
            ids, offsets = encoding.ids, encoding.offsets
        end = _end_of_turn(ids, offsets, start, self.eot_ids)
        if end is None:
            raise TargetError(f"target {self.name}: an assistant turn has no end-of-turn token in the rendering")
        return _Span(start, end)

    def _eot_start(self, full: str, reply: _Span) -> int:
        """Where the end-of-turn token of `reply` starts (a truncated reply stops before it)."""
        for token in (self.token_text.get(i, "") for i in self.eot_ids):
            if token and full.endswith(token, reply.start, reply.end):
                return reply.end - len(token)
        return reply.end

    def _body_mask(self, body: list[int], thinking: bool, mask_empty_think: bool, final: dict[str, Any]) -> list[int]:
        """1 on the reply and its end token; with `mask_empty_think`, 0 on an empty think block it opens with."""
        mask = [1] * len(body)
        if not (thinking and mask_empty_think and not (final.get("reasoning") or "").strip()):
            return mask
        close = self.tokenizer.token_to_id(THINK_CLOSE)
        if close in body:
            stop = body.index(close) + 1
            while stop < len(body) and not self.tokenizer.decode([body[stop]]).strip():
                stop += 1  # the blank lines after the block belong to it
            mask[:stop] = [0] * stop
        return mask

    def _history_tokens(self, message: dict[str, Any], prompt: str) -> int:
        """An earlier regenerated turn's token count: the engine's own, else its text's plus reasoning that the
        template left out of the prompt."""
        if message.get("output_ids") is not None:
            return len(message["output_ids"])
        texts = [message.get("content") or ""]
        if (reasoning := (message.get("reasoning") or "").strip()) and reasoning not in prompt:
            texts.append(reasoning)
        return sum(len(self.tokenizer.encode(t, add_special_tokens=False).ids) for t in texts)


def _hf_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates read it: reasoning under `reasoning_content` (Qwen3's name) and `reasoning`."""
    out = {"role": message["role"], "content": message.get("content") or ""}
    if message["role"] == "assistant" and message.get("reasoning"):
        out["reasoning_content"] = out["reasoning"] = message["reasoning"]
    return out


def _common(a: str, b: str) -> int:
    """Length of the common prefix of two strings."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _end_of_turn(ids: list[int], offsets: list[tuple[int, int]], start: int, ends: tuple[int, ...]) -> int | None:
    """The character offset just past the first end token starting at or after `start`."""
    for token, (begin, stop) in zip(ids, offsets, strict=True):
        if begin >= start and token in ends:
            return stop
    return None


def _end_ids(folder: Path, hf_tokenizer: Any) -> tuple[int, ...]:
    """The ids a reply may end with: generation_config.json's eos_token_id (one or a list) first, then the
    tokenizer's eos token."""
    ids: list[int] = []
    config = folder / "generation_config.json"
    if config.is_file():
        declared = json.loads(config.read_text()).get("eos_token_id")
        ids += declared if isinstance(declared, list) else [declared] if isinstance(declared, int) else []
    if hf_tokenizer.eos_token_id is not None:
        ids.append(hf_tokenizer.eos_token_id)
    if not ids:
        raise TargetError(f"{folder}: the tokenizer names no end-of-sequence token; set eos_token in its config")
    return tuple(dict.fromkeys(ids))


def load_derived(ref: str) -> DerivedTarget:
    """The target of a checkpoint folder, GGUF file or cached hub id (offline); one line when it cannot be one."""
    hint = f"set {TOKENIZER_ENV} to a local folder holding the model's tokenizer and chat template"
    try:
        folder = checkpoint_folder(ref, needs="tokenizer_config.json", hint=hint)
    except CheckpointError as exc:
        raise TargetError(f"target {CHECKPOINT}{ref}: {exc}") from None
    from transformers import AutoTokenizer

    settings.set_default("TOKENIZERS_PARALLELISM", "false")
    try:
        hf = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises many kinds for an unreadable tokenizer; all are this line
        raise TargetError(f"target {CHECKPOINT}{ref}: its tokenizer does not load ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None  # fmt: skip
    if not getattr(hf, "is_fast", False):
        raise TargetError(f"target {CHECKPOINT}{ref}: only fast tokenizers (tokenizer.json) are supported")
    if not hf.chat_template:
        raise TargetError(f"target {CHECKPOINT}{ref}: the checkpoint has no chat template (chat_template.jinja or "
                          "tokenizer_config.json's chat_template); add the model's template, or set `target` to a "
                          "profile")  # fmt: skip
    return DerivedTarget(ref, folder, hf)
