"""The `trainer_parity` check's work: every exported trainer file of every dataset, and the mix's, run
through the trainer's own code and compared with the parquet written beside it (pure; `defs` wires it).

The tokenized files block on any difference. The text files are SpecForge's own template applied to our
conversations: they always differ where its templates differ from the target's (a default system
message, supervised think markers and template tokens), so named causes are reported and only
unexplained ones (`parity.UNEXPLAINED`) block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import polars as pl

from eagle_data import layout, settings
from eagle_data.catalog import PROFILE_ENV, DatasetSpec
from eagle_data.drafter.mixfile import local_mix  # a stored file as a local path (S3: a temporary download)
from eagle_data.exports import parity
from eagle_data.exports.formats import chosen
from eagle_data.exports.parity import Markers, Parity, ParityError, TextRun
from eagle_data.exports.settings import ExportSettings
from eagle_data.quality import registry
from eagle_data.storage import ShardStore
from eagle_data.targets import load_target, resolve_target
from eagle_data.targets.profile import read_profiles

PARITY_CHECK = registry.implemented("parity", ("trainer_parity",))[0].name  # judged by check_exports
CHECKPOINT_ENV = "EAGLE_DATA_CAPTURE_CHECKPOINT"  # the target folder hidden-state capture reads too
Measure = Callable[[Path, Path, Sequence[int], int], Parity]  # (file, its parquet, sampled rows, rows) -> parity


@dataclass(frozen=True)
class Report:
    """Every file's parity, and the one-line verdict."""

    files: tuple[tuple[str, bool, Parity], ...]  # (dataset or "mix", tokenized, parity)

    @property
    def failures(self) -> list[str]:
        return [f"{where} {p.file}: {', '.join(f'{c} {p.causes[c]}' for c in p.blocking(tokenized))}"
                + (f" ({p.error})" if p.error else "")
                for where, tokenized, p in self.files if p.blocking(tokenized)]  # fmt: skip

    def summary(self) -> str:
        if self.failures:
            return "a trainer would train on data other than ours: " + "; ".join(self.failures)
        return f"{len(self.files)} trainer files: " + "; ".join(
            f"{where} {p.file} {p.identical}/{p.checked} identical"
            + "".join(f", {c} {n}" for c, n in sorted(p.causes.items()))
            for where, _, p in self.files
        )

    def table(self) -> str:
        lines = ["| file | format | rows | checked | identical | differences by cause (rows) | blocks |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for where, tokenized, p in self.files:
            causes = ", ".join(f"{c} {n}" for c, n in sorted(p.causes.items())) or "none"
            lines.append(f"| {where}/{p.file} | {p.format} | {p.rows} | {p.checked} | {p.identical} | {causes} | "
                         f"{'yes' if p.blocking(tokenized) else 'no'} |")  # fmt: skip
        return "\n".join(lines)


def trainer_tokenizer(config: ExportSettings) -> str:
    """The folder SpecForge would load the target's tokenizer from (its model.target_model_path)."""
    folder = config.trainer_tokenizer or settings.get(CHECKPOINT_ENV)
    if not folder and settings.get(PROFILE_ENV) == "demo":
        from eagle_data.demo import ensure_demo_model

        folder = str(ensure_demo_model())
    if not folder:
        raise ParityError(f"trainer_parity: the text exports need the target's tokenizer folder; set [exports] "
                          f"trainer_tokenizer or {CHECKPOINT_ENV}, or drop the text formats")  # fmt: skip
    return folder


def text_run(spec: DatasetSpec, train: Path, config: ExportSettings, tokenizer: object) -> TextRun:
    """SpecForge's parser for `spec`'s target, thinking setting and template."""
    models = pl.scan_parquet(train).select(pl.col("model").unique()).collect()["model"].drop_nulls().to_list()
    name = resolve_target(spec.target, models)
    target = load_target(name)
    think = target.think_ids
    template = config.specforge_template or parity.SPECFORGE_TEMPLATES.get(
        (_format_name(name), spec.generation.thinking), ""
    )
    if not template:
        raise ParityError(f"trainer_parity: no SpecForge template known for target {name}; set [exports] "
                          "specforge_template (SpecForge's data.chat_template)")  # fmt: skip
    return TextRun.build(tokenizer, template, Markers(think, target.eot_id))


def _format_name(profile: str) -> str:
    """The chat format a profile names in targets.toml ("" for a checkpoint's own template)."""
    profiles = read_profiles()
    return profiles[profile].format_name if profile in profiles else ""


def _one(store: ShardStore, key: str, train_key: str, config: ExportSettings, measure: Measure) -> Parity:
    """One trainer file against the parquet written beside it, on `parity_rows` sampled rows."""
    with local_mix(store, train_key) as train, local_mix(store, key) as jsonl:
        rows = pl.scan_parquet(train).select(pl.len()).collect().item()
        return measure(jsonl, train, parity.sample(rows, config.parity_rows), rows)


def check_exports(store: ShardStore, specs: Sequence[DatasetSpec], config: ExportSettings) -> Report:
    """The parity of every trainer file the last export wrote (datasets without export files are skipped)."""
    formats = chosen(config.formats)
    tokenizer = parity.load_tokenizer(trainer_tokenizer(config)) if any(not f.tokenized for f in formats) else None
    files: list[tuple[str, bool, Parity]] = []
    for spec in specs:
        train_key = layout.export_file(spec.name, layout.TRAIN_FILE)
        if not store.exists(train_key):
            continue
        run = None
        for fmt in formats:
            if run is None and not fmt.tokenized:
                with local_mix(store, train_key) as train:
                    run = text_run(spec, train, config, tokenizer)
            key = layout.export_file(spec.name, fmt.file)
            tokenized = partial(parity.prompts_parity, fmt)
            measure = tokenized if fmt.tokenized else partial(parity.text_parity, fmt, run=run)
            files.append((spec.name, fmt.tokenized, _one(store, key, train_key, config, measure)))
    if store.exists(layout.mix()):
        for fmt in (f for f in formats if f.mix):
            measure = partial(parity.prompts_parity, fmt)
            files.append(("mix", True, _one(store, layout.mix_file(fmt.file), layout.mix(), config, measure)))
    return Report(tuple(files))
