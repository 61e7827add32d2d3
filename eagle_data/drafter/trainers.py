"""The capture's export targets: one entry per (trainer, drafter kind), every convention it reads, as data.

Choosing entries in the catalog (`[drafter.capture] formats`) picks the layers, the last state's norm, the
supervised-token floor, the files and their keys, dtypes and shapes, and the vocabulary mapping files:
`resolve` derives the capture from them and refuses, in one line naming the setting, a capture setting a
chosen trainer cannot use. The writers and readers (`formats.py`), the set-aside rows (`capture.py`), the
plan's bytes (`hidden_states.py`) and the draft vocabulary files (`stages/draft_vocab.py`) all read these entries;
docs/hidden-states.md has them as one table, and each entry is loaded by its trainer's own released code in
eagle_data_tests/unit/test_trainers_load.py.

Tensor sources: `input_ids`, `loss_mask` (the row's), `aux` (the auxiliary layers concatenated, A*H wide),
`last` (the last state, H wide), `layers` (every stored layer, [seq, layers, H]: auxiliary, then the last).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from eagle_data.types import UserError

Source = Literal["input_ids", "loss_mask", "aux", "last", "layers"]
Norm = Literal["after_norm", "before_norm"]
_NORM_WORDS = {"after_norm": "after the final norm", "before_norm": "before the final norm (it applies it itself)"}
TORCH, SAFETENSORS, NATIVE_FILES = "torch", "safetensors", "native"


class TrainerError(UserError, ValueError):
    """The capture settings and the chosen trainers disagree; the message names the setting to change."""


@dataclass(frozen=True)
class Tensor:
    """One stored tensor: its key, what it holds, its dtype ("states": the capture's dtype) and whether it
    carries a leading batch dimension of 1."""

    key: str
    source: Source
    dtype: Literal["int64", "int32", "uint8", "states"]
    batch_dim: bool = False

    def shape(self) -> str:
        inner = {"input_ids": "seq", "loss_mask": "seq", "aux": "seq, A*H", "last": "seq, H", "layers": "seq, L, H"}
        return f"[{'1, ' if self.batch_dim else ''}{inner[self.source]}]"


@dataclass(frozen=True)
class Trainer:
    """An export target. Attributes:
    name: its value in `[drafter.capture] formats`; also its folder under the capture.
    kind: the drafter it trains, which picks the layer preset ("eagle3", "dflash"; None: any).
    last_state: the norm convention of the last state it reads (None: it reads none, any capture serves it).
    files: the file pattern under `{capture}/{name}/` ({group}: the row's group of 2,000; {shard}: the
        capture shard; {index}: the row's place in its shard's dataset).
    container: torch.save per row, safetensors per row, or the native batch files.
    tensors: what each file holds.
    floor: the rows it refuses: "consecutive" (fewer than two adjacent supervised tokens), "supervised"
        (no supervised token) or None; such rows are set aside for the whole capture.
    dataset: whether a shard also gets the prepared Arrow dataset (input_ids, loss_mask, seq_len) whose
        row i is `hs_{i}`.
    vocab: the draft-vocabulary files it loads (see VOCAB_FILES), or None.
    loader: the trainer's own code that reads the files; command: how a user trains on them.
    """

    name: str
    trainer: str
    kind: Literal["eagle3", "dflash"] | None
    last_state: Norm | None
    files: str
    container: str
    tensors: tuple[Tensor, ...]
    floor: Literal["consecutive", "supervised"] | None
    vocab: str | None
    ordering: str
    loader: str
    command: str
    dataset: bool = False


_IDS, _MASK = Tensor("input_ids", "input_ids", "int64"), Tensor("loss_mask", "loss_mask", "int64")
_SPECFORGE_FILES = "rows_{group}-{group_end}/data_{row}.ckpt"
_SPECFORGE_ORDER = "by file path (SpecForge lists the files sorted)"
_SPECFORGE_LOADER = "builtin_algorithm_registry().resolve(kind).providers.offline_for('text')"


def _specforge_dflash_family(kind: str, last: Norm | None, extra: tuple[Tensor, ...]) -> Trainer:
    return Trainer(
        f"specforge-{kind}", "SpecForge", "dflash", last, _SPECFORGE_FILES, TORCH,
        (_IDS, _MASK, Tensor("hidden_states", "aux", "states", True), *extra), "consecutive", None,
        _SPECFORGE_ORDER, _SPECFORGE_LOADER,
        f"specforge train -c cfg.yaml (training.strategy: {kind}, data.hidden_states_path: .../specforge-{kind})",
    )  # fmt: skip


def _speculators(kind: Literal["eagle3", "dflash"]) -> Trainer:
    return Trainer(
        f"speculators-{kind}", "speculators", kind, "before_norm", "{shard}/hidden_states/hs_{index}.safetensors",
        SAFETENSORS, (Tensor("hidden_states", "layers", "states"), Tensor("token_ids", "input_ids", "int64")),
        "supervised", "npy", "hs_{i} is row i of the shard's Arrow dataset (the shard's captured rows in mix order)",
        "speculators.train.data.ArrowDataset(max_len, datapath=.../{shard})",
        f"speculators train --speculator-type {kind} --verifier-name-or-path TARGET "
        f"--data-path .../speculators-{kind}/{{shard}} --d2t-path d2t-{{size}}.npy --t2d-path t2d-{{size}}.npy",
        dataset=True,
    )  # fmt: skip


REGISTRY: dict[str, Trainer] = {
    t.name: t
    for t in (
        Trainer(
            "specforge-eagle3", "SpecForge", "eagle3", "after_norm", _SPECFORGE_FILES, TORCH,
            (_IDS, _MASK, Tensor("hidden_state", "last", "states", True),
             Tensor("aux_hidden_state", "aux", "states", True)),
            None, "pt", _SPECFORGE_ORDER, _SPECFORGE_LOADER,
            "specforge train -c cfg.yaml (training.strategy: eagle3, data.hidden_states_path: .../specforge-eagle3)",
        ),
        _specforge_dflash_family("dflash", None, ()),
        _specforge_dflash_family("domino", None, ()),
        _specforge_dflash_family(
            "dspark", "after_norm", (Tensor("target_last_hidden_states", "last", "states", True),)
        ),
        _speculators("eagle3"),
        _speculators("dflash"),
        Trainer(
            "modelopt", "ModelOpt", "eagle3", "after_norm", "{shard}/{row}.pt", TORCH,
            (_IDS, _MASK, Tensor("hidden_states", "last", "states"), Tensor("aux_hidden_states", "aux", "states")),
            None, "modelopt", "any (ModelOpt lists rglob('*.pt'))",
            "modelopt.torch.speculative.eagle.utils.OfflineSupervisedDataset(sorted(root.rglob('*.pt')))",
            "examples/speculative_decoding/main.py --offline_data_path .../modelopt",
        ),
        Trainer(
            "native", "eagle-data", None, None, "{shard}/batch_{batch}.safetensors + {shard}/index.json", NATIVE_FILES,
            (Tensor("hidden_states", "layers", "states"), Tensor("input_ids", "input_ids", "int32"),
             Tensor("loss_mask", "loss_mask", "uint8")),
            None, None, "rows end to end by length; index.json gives each row's file, start and length",
            "eagle_data.drafter.formats.read_native", "your own loader",
        ),
    )
}  # fmt: skip
NAMES = tuple(REGISTRY)

# Draft-vocabulary files by format ({size}: the draft vocabulary size). SpecForge's is always written.
VOCAB_FILES: dict[str, tuple[str, ...]] = {
    "pt": ("vocab_mapping_{size}.pt",),  # torch.save({"d2t": int64, "t2d": bool}): SpecForge load_vocab_mapping
    "npy": ("d2t-{size}.npy", "t2d-{size}.npy"),  # np.save: speculators --d2t-path / --t2d-path
    "modelopt": ("d2t-{size}.pt",),  # torch.save(d2t int64): ModelOpt load_draft_vocab_cache
}


@dataclass(frozen=True)
class Capture:
    """What the chosen trainers need captured: the layer preset and the last state (None: none)."""

    preset: Literal["eagle3", "dflash"]
    last: Norm | None


def chosen(names: tuple[str, ...]) -> list[Trainer]:
    return [REGISTRY[n] for n in names]


def resolve(names: tuple[str, ...], layers: object, last_state: str) -> Capture:
    """The capture the chosen trainers need, given the `layers` and `last_state` settings ("auto": theirs);
    a setting a chosen trainer cannot use is refused in one line naming it and what to set."""
    picked = chosen(names)
    kinds = {t.kind: t.name for t in picked if t.kind}
    if len(kinds) > 1:
        raise TrainerError(
            f"[drafter.capture] formats: {' and '.join(kinds.values())} train different drafters "
            "(eagle3 and dflash layers): choose formats of one kind per capture"
        )
    if layers in ("eagle3", "dflash") and kinds and layers not in kinds:
        (kind, name), = kinds.items()  # fmt: skip
        raise TrainerError(f'[drafter.capture] layers = "{layers}": {name} trains {kind}; set layers = "auto"')
    preset = next(iter(kinds), None) or (layers if layers in ("eagle3", "dflash") else "eagle3")
    norms = {t.last_state: t.name for t in picked if t.last_state}
    if len(norms) > 1:
        reads = " and ".join(f"{n} reads the last state {_NORM_WORDS[k]}" for k, n in norms.items())
        raise TrainerError(f"[drafter.capture] formats: {reads}: capture them separately")
    if last_state == "auto":
        last = next(iter(norms), None) or ("after_norm" if preset == "eagle3" else None)
    else:
        needed = next(iter(norms.items()), None)
        if needed and last_state != needed[0]:
            raise TrainerError(
                f'[drafter.capture] last_state = "{last_state}": {needed[1]} reads the last state '
                f"{_NORM_WORDS[needed[0]]}; "
                f'set last_state = "{needed[0]}" or "auto"'
            )
        last = None if last_state == "none" else last_state
    if preset == "eagle3" and last is None and not isinstance(layers, tuple):
        raise TrainerError('[drafter.capture] last_state = "none": EAGLE-3 trains on the last state; set it or "auto"')
    return Capture(preset, last)  # type: ignore[arg-type]


def vocab_names(names: tuple[str, ...], size: int) -> list[str]:
    """The draft-vocabulary files written for the chosen trainers: SpecForge's always, then theirs."""
    formats = ["pt", *sorted({t.vocab for t in chosen(names) if t.vocab and t.vocab != "pt"})]
    return [pattern.format(size=size) for f in formats for pattern in VOCAB_FILES[f]]


def refuses(floor: str, mask: list[int]) -> bool:
    """Whether a trainer with this supervised-token floor refuses a row with this loss mask."""
    if floor == "consecutive":  # SpecForge's has_consecutive_supervised_tokens
        return not any(a and b for a, b in pairwise(mask))
    return floor == "supervised" and not any(mask)


def markdown_table() -> str:
    """The registry as the docs' table (docs/hidden-states.md; test_docs_match_code keeps them equal)."""
    lines = [
        "| format | trainer, kind | last state | files; order | keys (dtype, shape) | floor | vocab | loaded by "
        "| train |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in REGISTRY.values():
        keys = ", ".join(f"`{x.key}` ({x.dtype}, {x.shape()})" for x in t.tensors)
        vocab = " + ".join(f"`{p}`" for p in VOCAB_FILES[t.vocab]) if t.vocab else "-"
        lines.append(
            f"| `{t.name}` | {t.trainer}, {t.kind or 'any'} | {t.last_state or 'not read'} | `{t.files}`; {t.ordering} "
            f"| {keys} | {t.floor or '-'} | {vocab} | `{t.loader}` | `{t.command}` |"
        )
    return "\n".join(lines)
