"""Train/serve parity: our exported trainer files run through the trainer's own released code (pure).

A row passes when the trainer ends up with our verified ids and loss mask. SpecForge 0.2.0 is read from
its released package, installed with `--no-deps` (it pins torch, transformers and sglang): the modules
used here import no more than torch, transformers and pydantic.
- Tokenized files (`prompts.jsonl`): `specforge.data.prompt_builder.prepare_prompt_tasks`, the loader
  behind `data.prompts_path`, on the sampled lines as written.
- Text files: the parser `specforge.data.preprocessing.preprocess_conversations` picks for the template
  (`specforge.data.parse`, `specforge.data.template.TEMPLATE_REGISTRY`), called as it calls it, with the
  tokenizer SpecForge loads from the target's folder. (`preprocessing` itself imports `datasets`.)
Every difference is counted by cause (`CAUSES`). A cause is found by turning one knob of SpecForge's
own template (no default system message) and comparing again, then reading the differing mask positions.
"""

from __future__ import annotations

import functools
import json
import random
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data.exports.formats import ExportFormat
from eagle_data.types import UserError

SPECFORGE = "specforge==0.2.0"
# Not an extra of ours: SpecForge pins torch, transformers and sglang, which would replace ours (docs/facts.md).
INSTALL = f"pip install --no-deps {SPECFORGE} (make setup does)"
# our target chat format (targets.toml) and thinking setting -> the SpecForge template a user would pick
SPECFORGE_TEMPLATES = {
    ("chatml-qwen3", True): "qwen3-thinking",
    ("chatml-qwen3", False): "qwen3-instruct",
    ("kimi-k2", True): "kimi-k2-thinking",
}
CAUSES = {
    "default_system_message": "the trainer's template inserts a system message the row does not have",
    "think_markers": "the trainer supervises think-block tokens (<think>, </think>, the newlines after them)",
    "template_tokens": "the trainer supervises template tokens (the newline after the end-of-turn token)",
    "retokenized": "the same text in other tokens: the trainer encodes the text again, where our ids are the "
    "tokens the model generated (not always the tokenizer's own split of that text)",
    "reasoning_not_carried": "the format has no reasoning field: the trainer's text lacks the reasoning",
    "not_loaded": "the trainer's loader left the row out or refused the file",
    "other": "ids or mask differ for a reason not named above",
}
UNEXPLAINED = ("not_loaded", "other")  # block a text export: the trainer's data differs in a way not named


class ParityError(UserError, RuntimeError):
    """The parity run cannot start (trainer package or tokenizer missing); one line saying what to do."""


class TrainerMissing(ParityError):
    """The trainer's own code is not installed, so parity was not verified (not that it failed)."""


@dataclass(frozen=True)
class Markers:
    """Token ids the cause of a mask difference is read from: the think markers and the end-of-turn token."""

    think: frozenset[int]
    end_of_turn: int


@dataclass
class Parity:
    """One exported file against what the trainer made of it."""

    format: str
    file: str
    rows: int  # rows in the file
    checked: int = 0
    identical: int = 0
    causes: Counter[str] = field(default_factory=Counter)  # rows per cause (a row may have several)
    tokens: Counter[str] = field(default_factory=Counter)  # differing mask positions per cause
    example: dict[str, str] = field(default_factory=dict)  # cause -> the first row id showing it
    error: str = ""  # the trainer refused the file

    def count(self, row_id: str, causes: dict[str, int]) -> None:
        """One checked row: its causes (none: identical), each with its differing mask positions."""
        self.checked += 1
        if not causes:
            self.identical += 1
        for cause, positions in causes.items():
            self.causes[cause] += 1
            self.tokens[cause] += positions
            self.example.setdefault(cause, row_id)

    def blocking(self, tokenized: bool) -> list[str]:
        """Causes that fail the check: any for a tokenized file (the trainer must load our data as is),
        the unexplained ones for a text file."""
        return sorted(c for c in self.causes if tokenized or c in UNEXPLAINED)

    def figures(self) -> dict[str, Any]:
        return {"rows": self.rows, "checked": self.checked, "identical": self.identical,
                "causes": dict(self.causes), "tokens": dict(self.tokens), "example": self.example,
                **({"error": self.error} if self.error else {})}  # fmt: skip


def sample(rows: int, take: int, seed: int = 0) -> list[int]:
    """Row numbers to check: every row when `take` is 0 or covers them, else `take` drawn with `seed`."""
    if take == 0 or take >= rows:
        return list(range(rows))
    return sorted(random.Random(seed).sample(range(rows), take))


def picked_lines(path: Path, picks: Sequence[int]) -> list[bytes]:
    """The lines at `picks` (ascending) of a JSONL file, read in one pass."""
    wanted, out = set(picks), []
    with path.open("rb") as fh:
        for number, line in enumerate(fh):
            if number in wanted:
                out.append(line)
    return out


def reference(parquet: Path, picks: Sequence[int]) -> list[tuple[str, list[int], list[int]]]:
    """Our (prompt_id, input_ids, loss_mask) at `picks` of the parquet file written beside the JSONL."""
    rows = (
        pl.scan_parquet(parquet).with_row_index("_row").filter(pl.col("_row").is_in(list(picks)))
        .select("prompt_id", "input_ids", "loss_mask").collect(engine="streaming")
    )  # fmt: skip
    return list(rows.iter_rows())


def _import_specforge(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(f"specforge.data.{module}")
    except ImportError as exc:
        raise TrainerMissing(f"trainer_parity not verified: SpecForge's data modules are not installed ({exc}); "
                             f"to verify, {INSTALL}") from None


def prompts_parity(fmt: ExportFormat, jsonl: Path, parquet: Path, picks: Sequence[int], rows: int) -> Parity:
    """The sampled lines of a pre-tokenized file, loaded by SpecForge's `data.prompts_path` loader (no
    truncation, no loss floor), against our rows: every id and mask value must be equal."""
    loader = _import_specforge("prompt_builder")
    ours, lines = reference(parquet, picks), picked_lines(jsonl, picks)
    parity = Parity(fmt.name, jsonl.name, rows)
    with tempfile.TemporaryDirectory(prefix="eagle-parity-") as folder:
        path = Path(folder, jsonl.name)
        path.write_bytes(b"".join(lines))
        longest = max((len(ids) for _, ids, _ in ours), default=1)
        try:
            loaded = loader.prepare_prompt_tasks(
                path, None, chat_template=None, max_length=longest, is_preformatted=False, train_only_last_turn=False,
                cache_dir=None, cache_key=None, num_proc=None, min_loss_tokens=0,
            )  # fmt: skip
        except ValueError as exc:
            parity.error, loaded = str(exc).splitlines()[0], []
    for number, (prompt_id, ids, mask) in enumerate(ours):
        if number >= len(loaded):
            parity.count(prompt_id, {"not_loaded": 0})
            continue
        payload, line_id = loaded[number]["payload"], json.loads(lines[number]).get("id")
        same = line_id == prompt_id and payload["input_ids"] == ids and payload["loss_mask"] == mask
        parity.count(prompt_id, {} if same else {"other": 0})
    return parity


def _parser(tokenizer: Any, template: Any) -> Any:
    """The parser SpecForge's `preprocess_conversations` builds for `template` (its dispatch, by parser_type)."""
    parse = _import_specforge("parse")
    kinds = {"general": parse.GeneralParser, "thinking": parse.ThinkingParser, "glm": parse.GLMParser,
             "openai-harmony": parse.HarmonyParser}  # fmt: skip
    return kinds[template.parser_type](tokenizer, template)


def specforge_template(name: str) -> Any:
    registry = _import_specforge("template").TEMPLATE_REGISTRY
    if name not in registry.get_all_template_names():
        raise ParityError(f"SpecForge has no chat template {name!r}; set [exports] specforge_template to one of "
                          f"{', '.join(sorted(registry.get_all_template_names()))}")  # fmt: skip
    return registry.get(name)


@cache
def load_tokenizer(folder: str) -> Any:
    """The tokenizer SpecForge loads from the target's folder (AutoTokenizer); it must carry a chat template.
    Loaded once per process (a 150k vocabulary takes seconds)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ParityError(f"trainer_parity: no tokenizer in {folder} ({str(exc).splitlines()[0]}); set [exports] "
                          "trainer_tokenizer to the target's local transformers folder") from None  # fmt: skip
    if not getattr(tokenizer, "chat_template", None):
        raise ParityError(
            f"trainer_parity: the tokenizer in {folder} has no chat template; SpecForge would fall "
            "back to plain concatenation: point [exports] trainer_tokenizer at the target's folder"
        )
    return tokenizer


def mask_causes(ids: Sequence[int], ours: Sequence[int], theirs: Sequence[int], markers: Markers) -> dict[str, int]:
    """Differing mask positions of equal ids, by cause: a think marker or the token right after one; the
    token right after the end-of-turn token; else other."""
    causes: Counter[str] = Counter()
    for j, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a == b:
            continue
        before = ids[j - 1] if j else None
        if ids[j] in markers.think or before in markers.think:
            causes["think_markers"] += 1
        elif before == markers.end_of_turn:
            causes["template_tokens"] += 1
        else:
            causes["other"] += 1
    return dict(causes)


@dataclass(frozen=True)
class TextRun:
    """What the text path needs: SpecForge's parser for the template, and one with the template's default
    system message turned off (to name that cause)."""

    parser: Any
    no_system: Any
    system_prompt: str
    markers: Markers
    decode: Any  # the tokenizer's decode, special tokens kept

    @classmethod
    def build(cls, tokenizer: Any, template_name: str, markers: Markers) -> TextRun:
        template = specforge_template(template_name)
        bare = template.model_copy(update={"system_prompt": ""})
        return cls(
            _parser(tokenizer, template),
            _parser(tokenizer, bare),
            template.system_prompt or "",
            markers,
            functools.partial(tokenizer.decode, skip_special_tokens=False),
        )

    def causes(
        self, conversation: list[dict[str, Any]], ids: list[int], mask: list[int], fmt: ExportFormat
    ) -> dict[str, int]:
        """Why SpecForge's tokens of one conversation differ from our (ids, mask); empty when they do not."""
        found: dict[str, int] = {}
        longest = 2 * len(ids) + 4096  # never SpecForge's truncation: its data.max_length is the user's to set
        theirs, their_mask = (t.tolist() for t in self.parser.parse(conversation, longest, tool=[]))
        has_system = any(m.get("role", m.get("from")) == "system" for m in conversation)
        if theirs != ids and self.system_prompt and not has_system:
            theirs, their_mask = (t.tolist() for t in self.no_system.parse(conversation, longest, tool=[]))
            found["default_system_message"] = 0
        if theirs != ids:
            if self.decode(theirs) == self.decode(ids):
                found["retokenized"] = 0
            else:
                found["other" if fmt.reasoning else "reasoning_not_carried"] = 0
            return found
        return found | mask_causes(ids, mask, their_mask, self.markers)


def text_parity(fmt: ExportFormat, jsonl: Path, parquet: Path, picks: Sequence[int], rows: int, run: TextRun) -> Parity:
    """The sampled rows of a text file, tokenized by SpecForge's own template path, against our rows."""
    import warnings

    parity = Parity(fmt.name, jsonl.name, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SpecForge warns per row about the system message it keeps
        for line, (prompt_id, ids, mask) in zip(picked_lines(jsonl, picks), reference(parquet, picks), strict=True):
            record = json.loads(line)
            found = run.causes(record["conversations"], ids, mask, fmt)
            parity.count(prompt_id, found if record.get("id") == prompt_id else found | {"other": 0})
    return parity
