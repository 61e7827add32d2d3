"""The estimate: a canary sample across the dataset, judged by the validation gates, and the tokens and
dollars of the whole run projected from it, before anything but the sample is paid for."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import polars as pl

from eagle_data import sources
from eagle_data.catalog import DatasetSpec
from eagle_data.quality import canary
from eagle_data.quality.canary import Canary
from eagle_data.quality.truncation import ReplyLengths, truncation_report
from eagle_data.report import Log
from eagle_data.runner import Estimate, RunnerSettings, estimate_generation, run_generation
from eagle_data.runner.resultlog import ResultLog, ResumeKey, resume_key, reusable
from eagle_data.runner.run import NothingAnswered
from eagle_data.stages.preflight import check_server_template, preflight
from eagle_data.stages.validation import target_name, validated_rows
from eagle_data.storage import ShardStore
from eagle_data.targets import load_target
from eagle_data.types import Engine


@dataclass(frozen=True)
class PreFlight:
    """What the estimate step found before anything but the sample was paid for."""

    canary: Canary
    estimate: Estimate | None  # None when no sampled prompt was answered: nothing to project from


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
    target = target_name(spec, answered) if answered.height else spec.target
    judged = canary.judge(
        validated, spec.checks, spec.generation.thinking, dataset=spec.name, max_tokens=key.max_tokens,
        suggested_max_tokens=cut.suggested_max_tokens, config_hash=key.config_hash, target=target,
    )  # fmt: skip
    if not answered.height:
        return PreFlight(judged, None)
    tokenizer = load_target(target).text_encoder
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
