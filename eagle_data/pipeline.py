"""The stage functions not yet in eagle_data/stages/: the pre-flight checks, the estimate and the export.

Dagster assets (defs/assets.py) call these, so the stage logic exists once and runs without Dagster. The
shard stages (prompts, generation, validation) live in eagle_data/stages/ and write no shard: the shard IO
manager does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from eagle_data import engines, exports, layout, sources
from eagle_data.catalog import CatalogError, DatasetSpec
from eagle_data.drafter.evalsets import BenchmarkError, benchmark_index
from eagle_data.drafter.settings import load_drafter_settings
from eagle_data.exports.formats import DEFAULT_FORMATS, chosen
from eagle_data.quality import canary
from eagle_data.quality.canary import Canary
from eagle_data.quality.truncation import ReplyLengths, truncation_report
from eagle_data.runner import Estimate, RunnerSettings, estimate_generation, run_generation
from eagle_data.runner.prices import refuse_unpriced
from eagle_data.runner.resultlog import ResultLog, ResumeKey, resume_key, reusable
from eagle_data.runner.rows import plan_turns
from eagle_data.runner.run import NothingAnswered
from eagle_data.stages.validation import target_name, validated_rows
from eagle_data.storage import CorruptFile, ShardStore, StorageError, digest
from eagle_data.storage.shards import shards_written as shards_written  # cli and defs/exports call it from here
from eagle_data.targets import TargetError, load_target, prompt_difference, resolve_target
from eagle_data.types import Engine, EngineError, RetryableError, UserError

Log = Callable[[str], None]


def prompts_asset(spec: DatasetSpec) -> str:
    return layout.prompts_asset(spec.name)


def validated_asset(spec: DatasetSpec) -> str:
    return layout.validated_asset(spec.name)


class PreflightError(UserError, RuntimeError):
    """Something a later stage needs is missing, found before the first paid request; the message says what."""


def preflight(spec: DatasetSpec, store: ShardStore, model: str, engine_kind: str = "") -> None:
    """Check, before the first paid request, that a dollar budget has a price to count with (`engine_kind`'s
    billing), and what the stages after generation need: the output root takes a write, the target's
    tokenizer loads (with `target = "auto"`, the one `model` maps to), every configured benchmark file reads.
    Each failure is one line; found at validation, it would come after the replies were paid for."""
    kind = engines.kinds().get(engine_kind)
    refuse_unpriced(spec.name, spec.cost_budget_usd, kind.billing if kind else "unknown", model)
    probe = layout.write_check(spec.name, f"{os.getpid()}-{time.time_ns()}")
    try:
        store.write_bytes(probe, b"")
        store.delete(probe)
        load_target(resolve_target(spec.target, [model]))
        benchmark_index(load_drafter_settings().decontamination)
    except (StorageError, TargetError, BenchmarkError, CatalogError) as exc:
        raise PreflightError(f"{spec.name}: before any request: {exc}") from None


def check_server_template(spec: DatasetSpec, engine: Engine, prompts: Mapping[str, pl.DataFrame], log: Log) -> None:
    """For an engine that reports the prompt ids its server rendered: send the dataset's first request (for a
    one-token reply) and stop before any other when the server renders it otherwise than the target profile,
    which would make every row a paid-for `prompt_mismatch`. `check_server_template = false` forces past it."""
    if not engine.reports_prompt_ids:
        return
    if not spec.check_server_template:
        log(f"WARNING {spec.name}: the server's chat template is not checked (check_server_template = false); "
            "rows it renders otherwise than the target are prompt_mismatch at validation")  # fmt: skip
        return
    first = next((frame["messages"].head(1).to_list()[0] for frame in prompts.values() if frame.height), [])
    segments = plan_turns(first, spec.regenerate, spec.max_turns)
    if not segments:
        return
    target = load_target(resolve_target(spec.target, [engine.model]))

    async def served() -> list[int]:
        try:
            await engine.check()
            return await engine.served_prompt_ids(segments[0])
        finally:
            await engine.aclose()

    try:
        difference = prompt_difference(target, segments[0], asyncio.run(served()), thinking=spec.generation.thinking)
    except EngineError as exc:  # a passing failure (a 503, a reset) is worth another run; the others say their fix
        again = "; run again (check_server_template = false skips the check)" if isinstance(exc, RetryableError) else ""
        raise PreflightError(f"{spec.name}: the server's chat template could not be checked: {exc}{again}") from None
    except TargetError as exc:
        raise PreflightError(f"{spec.name}: before any request: {exc}") from None
    if difference:
        raise PreflightError(
            f"{spec.name}: the server renders prompts with another chat template than target {target.name}: "
            f"{difference}; set `target` to the served model's profile or fix the server's template "
            "(check_server_template = false in the catalog entry generates anyway)"
        )
    log(f"{spec.name}: the server renders prompts as target {target.name} does (checked on one prompt)")


@dataclass(frozen=True)
class PreFlight:
    """What the estimate step found before anything but the sample was paid for."""

    canary: Canary
    estimate: Estimate | None  # None when no sampled prompt was answered: nothing to project from


def config_hash(spec: DatasetSpec, engine: Engine) -> str:
    """The generation config's hash (the resume key's): what a canary's verdict holds for."""
    return resume_key(engine.config(), spec).config_hash


def estimate(
    spec: DatasetSpec,
    store: ShardStore,
    engine: Engine,
    *,
    canary_prompts: int | None = None,
    usd_per_prompt_token: float,
    usd_per_completion_token: float,
    log: Log = print,
    settings: RunnerSettings | None = None,
    run_id: str = "",
) -> PreFlight:
    """Generate the canary sample (`canary_prompts`, default the catalog's, drawn across the whole
    dataset), judge it by the validation gates, and project tokens and dollars from it. The sample's rows
    stay in each partition's result log (no partial shard file): the full run reuses them, never pays twice."""
    preflight(spec, store, engine.model, engine.name)
    index = sources.load_index(spec, store)
    drawn = canary.draw(index.blocks(), canary_prompts or spec.canary_prompts, spec.shard_size)
    shards = {key: frame.select(list(sources.PROMPTS_SCHEMA)) for key, frame in drawn.items()}
    log(f"{spec.name}: canary of {sum(f.height for f in shards.values())} prompts over {len(shards)} partitions")
    check_server_template(spec, engine, shards, log)
    # The canary judges the whole sample below; the breaker, which would stop it part-way, stays off here.
    unbroken = spec.model_copy(update={"breaker": spec.breaker.model_copy(update={"enabled": False})})
    with contextlib.suppress(NothingAnswered):  # a sample with no answer at all is the canary's to judge
        run_generation(engine, unbroken, shards, store, settings=settings, log=log, write_shards=False, run_id=run_id)
    key = resume_key(engine.config(), spec)
    rows = {partition: sample_rows(spec, store, partition, prompts, key) for partition, prompts in shards.items()}
    validated = pl.concat(  # with each row's error, which names why a failed row failed (e.g. empty_reply)
        [validated_rows(spec, frame, partition).join(frame.select("prompt_id", "error"), on="prompt_id", how="left")
         for partition, frame in rows.items()], how="diagonal_relaxed",
    )  # fmt: skip
    answered = validated.filter(pl.col("status").is_in(["ok", "truncated"]))
    lengths = ReplyLengths.of(
        answered["completion_tokens"].to_list(), answered["finish_reason"].fill_null("").to_list()
    )
    cut = truncation_report(lengths, max_new_tokens=key.max_tokens, threshold=spec.checks.max_truncated_share)
    judged = canary.judge(
        validated, spec.checks, spec.generation.thinking, dataset=spec.name, max_tokens=key.max_tokens,
        suggested_max_tokens=cut.suggested_max_tokens, config_hash=key.config_hash,
    )  # fmt: skip
    if not answered.height:
        return PreFlight(judged, None)
    tokenizer = load_target(target_name(spec, answered)).text_encoder
    projected = estimate_generation(
        index.blocks(),
        spec,
        lambda texts: [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)],
        pl.concat(list(rows.values()), how="diagonal_relaxed"),
        usd_per_prompt_token,
        usd_per_completion_token,
    )
    return PreFlight(judged, projected)


def sample_rows(
    spec: DatasetSpec, store: ShardStore, partition: str, prompts: pl.DataFrame, key: ResumeKey
) -> pl.DataFrame:
    """The stored rows of `prompts` as this config stands: each prompt's reusable row (this config's or one a
    raised max_tokens keeps), else its latest row under this config, failed ones too (the canary judges them)."""
    ids = prompts["prompt_id"].implode()
    stored = ResultLog(store, spec.name, partition).load().filter(pl.col("prompt_id").is_in(ids))
    kept = reusable(stored, key)
    unanswered = ~pl.col("prompt_id").is_in(kept["prompt_id"].implode())
    others = (
        stored.filter((pl.col("config_hash") == key.config_hash) & unanswered)
        .sort("finished_at")
        .unique("prompt_id", keep="last", maintain_order=True)
    )
    return pl.concat([kept, others], how="diagonal_relaxed")


EXCLUDED_SHOWN = 200  # excluded shards listed in the export's metadata table; the log lists every one


def export_keys(spec: DatasetSpec, formats: Sequence[str] = DEFAULT_FORMATS) -> dict[str, str]:
    """Storage keys of a dataset's export files: each chosen trainer format's (by name), and "train"."""
    files = {f.name: layout.export_file(spec.name, f.file) for f in chosen(formats)}
    return {**files, "train": layout.export_file(spec.name, layout.TRAIN_FILE)}


def mix_keys(formats: Sequence[str] = DEFAULT_FORMATS) -> dict[str, str]:
    """Storage keys of the mix's trainer files (the chosen formats written for the whole mix), by name."""
    return {f.name: layout.mix_file(f.file) for f in chosen(formats) if f.mix}


def export(
    specs: list[DatasetSpec],
    store: ShardStore,
    admissions: Mapping[str, exports.Admission],
    *,
    seed: int,
    log: Log = print,
    bucket_rows: int | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> dict[str, Any]:
    """Per dataset, the chosen trainer files (`formats`, exports.formats) and tokenized parquet of the
    admitted shards' training rows; then the weighted training mix across datasets, and its trainer files.
    Streams: one shard, or one bucket of mix rows (`bucket_rows`, default sized from the rows' tokens), in
    memory at a time.

    A dataset with no admitted shard is left out and its old export files are removed (they may hold
    rows of shards that have since failed a check). Nothing to take at all is an ExportError, and then
    the old mix is removed too. All files are replaced only once the whole export has succeeded."""
    figures: dict[str, Any] = {}
    excluded = [(spec.name, key, reason) for spec in specs
                for key, reason in sorted(admissions.get(spec.name, exports.Admission()).excluded.items())]  # fmt: skip
    for name, key, reason in excluded:
        log(f"WARNING {name} shard {key} left out of the export: {reason}")
    with tempfile.TemporaryDirectory(prefix="eagle-export-") as spill, ExitStack() as staged:
        trains: dict[str, Path] = {}
        written: dict[str, exports.Written] = {}
        for spec in specs:
            admission = admissions.get(spec.name, exports.Admission())
            keys = export_keys(spec, formats)
            if not admission.admitted:
                for key in keys.values():
                    store.delete(key)
                continue
            files = {name: staged.enter_context(store.staged(key)) for name, key in keys.items()}
            trains[spec.name] = files.pop("train")
            changed: list[tuple[str, str, str]] = []
            shards = admitted_shards(spec, store, admission, changed)
            done = written[spec.name] = exports.write_dataset(shards, spec, files, trains[spec.name])
            for name, key, reason in changed:
                log(f"WARNING {name} shard {key} left out of the export: {reason}")
            excluded += changed
            shards_read = len(admission.admitted) - len(changed)
            figures.update({f"{spec.name}_rows": done.rows, f"{spec.name}_shards": shards_read})
            figures.update({f"{spec.name}_refused_{reason}": n for reason, n in sorted(done.dropped.items())})
            if done.dropped:
                log(f"WARNING {spec.name}: {sum(done.dropped.values())} rows kept at validation were refused "
                    f"on the way out ({dict(done.dropped)}); re-validate those shards")  # fmt: skip
        figures["excluded_shards"] = len(excluded)
        if excluded:
            figures["excluded"] = excluded_table(excluded)
        if not sum(done.rows for done in written.values()):
            for key in (layout.mix(), *mix_keys(formats).values()):
                store.delete(key)
            read = {name: done for name, done in written.items() if figures[f"{name}_shards"]}
            raise exports.ExportError(nothing_to_take(read, excluded))
        plan = exports.plan_mix({name: done.rows for name, done in written.items()},
                                {spec.name: spec.mix_weight for spec in specs}, seed)  # fmt: skip
        rows = sum(done.rows for done in written.values())
        size = bucket_rows or exports.bucket_rows(rows, sum(done.tokens for done in written.values()))
        mix_file = staged.enter_context(store.staged(layout.mix()))
        figures["mix_rows"] = exports.write_mix(trains, plan, mix_file, Path(spill), size)
        mixed = {name: staged.enter_context(store.staged(key)) for name, key in mix_keys(formats).items()}
        exports.write_mix_files(mix_file, mixed, size)
    figures["mix_path"] = store.uri(layout.mix())
    figures.update({f"mix_{name}_path": store.uri(key) for name, key in mix_keys(formats).items()})
    return figures


def admitted_shards(
    spec: DatasetSpec, store: ShardStore, admission: exports.Admission, changed: list[tuple[str, str, str]]
) -> Iterator[pl.DataFrame]:
    """The admitted validated shards of `spec`, in order, each read when reached; a shard whose bytes are not
    the ones its checks judged is skipped and noted in `changed` as (dataset, partition, reason): a torn or
    garbled one as unreadable, with the command that moves it aside."""
    for key in admission.admitted:
        data = store.shard_bytes(spec.name, validated_asset(spec), key)
        try:
            frame = store.parse_shard(spec.name, validated_asset(spec), key, data)
        except CorruptFile as exc:
            changed.append((spec.name, key, str(exc)))
            continue
        expected = admission.digests.get(key)
        if expected is not None and digest(data) != expected:
            changed.append((spec.name, key, "its bytes changed since its checks ran (a validation run that "
                            "stopped part-way rewrote it); re-materialize it"))  # fmt: skip
            continue
        yield frame


def nothing_to_take(written: Mapping[str, exports.Written], excluded: list[tuple[str, str, str]]) -> str:
    """The one line of an export with no row to write."""
    if written:
        return (f"training_mix: the admitted shards of {', '.join(sorted(written))} hold no row fit for training "
                "(see the refused counts in the log); fix the data and re-validate")  # fmt: skip
    if excluded:
        name, key, reason = excluded[0]
        return (f"training_mix: no validated shard passed every blocking check ({len(excluded)} left out, "
                f"e.g. {name} {key}: {reason}); fix the data or re-run the checks, then export again")  # fmt: skip
    return "training_mix: no validated shard yet; materialize {ds}_validated first"


def excluded_table(excluded: list[tuple[str, str, str]]) -> str:
    """Markdown table of the shards left out, the first EXCLUDED_SHOWN of them."""
    lines = ["| dataset | shard | reason |", "| --- | --- | --- |"]
    lines += [f"| {name} | {key} | {reason.replace('|', '/')} |" for name, key, reason in excluded[:EXCLUDED_SHOWN]]
    if len(excluded) > EXCLUDED_SHOWN:
        lines.append(f"| … | … | {len(excluded) - EXCLUDED_SHOWN} more in the run log |")
    return "\n".join(lines)
