"""The canary: a small sample drawn across a dataset, judged by the validation gates before the run is paid for.

The gates after validation fire only once every reply has been bought: a server that loses its replies'
text, answers "OK." to everything or cuts a fifth of the replies at max_tokens shows it in the first few
dozen replies. The canary judges those with the same row verdicts and dataset gates as validation
(`row_verdicts`, `run_checks`); it fails when a gate of severity ERROR fails, or when more replies hit
max_tokens than `max_truncated_share` allows (a warning at validation, but cheap to fix before the run).
A sample is small, so a share gate fails it only when the sample makes it sure: the one-sided Wilson
lower bound of the share at CONFIDENCE must exceed the gate's threshold (one stray short reply in 64 is
1.6%, over a 1% gate, yet says nothing; the breaker judges its window the same way).

The sample is the `k` prompts with the smallest hash of (seed, prompt_id) over every prompt of the
dataset, so it is spread over all partitions, the same on every run, and drawn from the prompt index
block by block in bounded memory.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import NormalDist

import polars as pl

from eagle_data.catalog import Checks, shard_key
from eagle_data.quality.gates import FAILED_RATE, TRUNCATION_RATE, CheckResult, Inputs, pct, run_checks
from eagle_data.quality.summary import share, wilson_lower
from eagle_data.quality.verdicts import (
    KEPT,
    LOST_TEXT,
    PROMPT_COUNT_MISMATCH,
    STRUCTURE_REASONS,
    is_answered,
    is_truncated,
)

EXAMPLES = 3  # prompt ids quoted in the one-line verdict
# How sure a failed share gate must be on the sample: at 0.999, 64 prompts with 18% of replies cut fail a 5%
# gate, and 4 of 64 short replies fail a 1% gate, while a healthy 0.8% rate does so about once in 400 canaries.
CONFIDENCE = 0.999
IGNORE_SETTING = "ignore_canary"  # the generation run config's override (eagle_data/defs/assets.py)
# The row verdicts each gate counts, so a failure names the verdict behind it (a failed row's by its error kind).
GATE_VERDICTS: dict[str, tuple[str, ...]] = {
    "empty_response": ("empty_completion", "short_loss"),
    "token_structure": STRUCTURE_REASONS,
    "lost_text": (LOST_TEXT,),
    FAILED_RATE: ("failed",),
    "reasoning_present": ("missing_reasoning",),
}


def rank(seed: int, prompt_id: str) -> int:
    """A prompt's place in the draw: 64 bits of a hash, stable across processes and versions."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{prompt_id}".encode(), digest_size=8).digest(), "big")


def draw(blocks: Iterable[pl.DataFrame], k: int, shard_size: int, seed: int = 0) -> dict[str, pl.DataFrame]:
    """The `k` prompts of smallest `rank` among every row of `blocks` (the prompt index, in order), grouped
    by partition key (a row's position over shard_size), in index order, with the `shard` column set.
    Holds at most `k` rows besides the block being read."""
    best: pl.DataFrame | None = None
    offset = 0
    for block in blocks:
        ranks = [rank(seed, prompt_id) for prompt_id in block["prompt_id"].to_list()]
        ranked = block.with_columns(
            pl.int_range(offset, offset + block.height, dtype=pl.Int64).alias("_position"),
            pl.Series("_rank", ranks, dtype=pl.UInt64),
        ).bottom_k(k, by="_rank")
        best = ranked if best is None else pl.concat([best, ranked]).bottom_k(k, by="_rank")
        offset += block.height
    if best is None or not best.height:
        return {}
    sample = best.sort("_position").with_columns((pl.col("_position") // shard_size).cast(pl.Int32).alias("shard"))
    return {
        shard_key(frame["shard"][0]): frame.drop("_position", "_rank")
        for frame in sample.partition_by("shard", maintain_order=True)
    }


@dataclass(frozen=True)
class Canary:
    """The sample's judgement. `line` is the one line a person reads; the rest is metadata."""

    dataset: str
    sample: int  # prompts judged
    shares: Mapping[str, float]  # verdict (a failed row's by its error kind) -> share of the sample
    failing: tuple[str, ...]  # the gates that failed on the sample
    truncated_share: float  # of answered replies
    suggested_max_tokens: int  # would have covered 95% of the sample's replies (censored estimate)
    config_hash: str  # the generation config the sample was made under (the resume key's)
    line: str
    examples: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return not self.failing

    def figures(self) -> dict[str, float | int | str]:
        """The estimate's metadata: sample size, shares per verdict, truncation, suggested max_tokens."""
        return {
            "canary_sample": self.sample,
            "canary_truncated_share": round(self.truncated_share, 4),
            "canary_suggested_max_tokens": self.suggested_max_tokens,
            **{f"canary_share_{verdict}": round(s, 4) for verdict, s in sorted(self.shares.items())},
        }

    def metadata(self) -> dict[str, float | int | str]:
        """The check's metadata: the figures, the failing gates and the config hash the refusal compares."""
        return {**self.figures(), "failing": ", ".join(self.failing), "config_hash": self.config_hash}


def labels(rows: pl.DataFrame) -> pl.Series:
    """Each row's verdict; a failed row's names its error kind (`failed: empty_reply`), which says more."""
    error_kind = pl.col("error").fill_null("").str.split(":").list.first() if "error" in rows.columns else pl.lit("")
    label = pl.when((pl.col("verdict") == "failed") & (error_kind != "")).then(pl.lit("failed: ") + error_kind)
    return rows.select(label.otherwise(pl.col("verdict")).alias("label"))["label"]


def judge(
    rows: pl.DataFrame,
    checks: Checks,
    thinking: bool,
    *,
    dataset: str,
    max_tokens: int,
    suggested_max_tokens: int,
    config_hash: str,
    target: str = "",
) -> Canary:
    """Judge the sample's validated rows (with verdicts) by the validation gates; `max_tokens` is the cap
    the sample ran under and `suggested_max_tokens` the one covering 95% of its replies; `target` the target the
    rows were tokenized for (named when the server counted other prompts)."""
    results = run_checks(rows, Inputs(checks, thinking))
    answered = rows.filter(is_answered())
    failing = tuple(
        r.name
        for r in results
        if not r.passed
        and (r.severity == "ERROR" or r.name == TRUNCATION_RATE)
        and sure(r, answered.height if r.name == TRUNCATION_RATE else rows.height)
    )
    named = labels(rows)
    counts = Counter(named.to_list())
    truncated = share(answered.filter(is_truncated()).height, answered.height)
    common = dict(
        dataset=dataset, sample=rows.height, shares={v: share(n, rows.height) for v, n in counts.items()},
        failing=failing, truncated_share=truncated, suggested_max_tokens=suggested_max_tokens,
        config_hash=config_hash,
    )  # fmt: skip
    if not failing:
        kept = share(sum(n for v, n in counts.items() if v in KEPT), rows.height)
        line = (f"{dataset}: canary passed: {pct(kept)} of {rows.height} prompts drawn across the dataset fit for "
                f"training, {pct(truncated)} of replies hit max_tokens={max_tokens}")  # fmt: skip
        return Canary(**common, line=line)  # type: ignore[arg-type]
    head = f"{dataset}: canary failed on {', '.join(failing)} ({rows.height} prompts drawn across the dataset)"
    gates = [r for r in results if r.name in failing and r.name != TRUNCATION_RATE]
    behind = {v for r in gates for v in GATE_VERDICTS.get(r.name, ())}  # the verdicts the failing gates count
    rejected = Counter({v: n for v, n in counts.items() if v.split(":")[0] in behind})
    parts, examples = [], ()
    if rejected:
        verdict, n = rejected.most_common(1)[0]
        examples = tuple(rows.filter(named == verdict)["prompt_id"].head(EXAMPLES).to_list())
        parts.append(f"{pct(n / rows.height)} of them are {verdict} (e.g. {', '.join(examples)})")
        if verdict == PROMPT_COUNT_MISMATCH:
            first = rows.filter(named == verdict).row(0, named=True)
            parts.append(
                f"the server counted {first['prompt_tokens']} prompt tokens for {first['prompt_id']} where target "
                f"{target or '(unnamed)'} renders {first['rendered_prompt_tokens']}: another vocabulary or chat "
                "template made the replies; set `target` to the served model's own"
            )
    elif gates:  # every row passed on its own, but together they fail (one completion or loss-mask sum dominating)
        parts.append(gates[0].message)
    if gates:
        parts.append(f"fix the engine or its server, then materialize {dataset}_estimate again")
    if TRUNCATION_RATE in failing:
        cut = tuple(answered.filter(is_truncated())["prompt_id"].head(EXAMPLES).to_list())
        examples = examples or cut
        limit = f"{checks.max_truncated_share * 100:g}%"
        parts.append(f"{pct(truncated)} of replies hit max_tokens={max_tokens} (limit {limit}; e.g. {', '.join(cut)}); "
                     f"max_tokens={suggested_max_tokens} would cover 95% of them: raise max_tokens in the catalog "
                     "and re-run")  # fmt: skip
    return Canary(**common, line=f"{head}: {'; '.join(parts)}", examples=examples)  # type: ignore[arg-type]


def sure(result: CheckResult, n: int) -> bool:
    """A failed gate whose figure is a share of `n` rows fails the sample only when its Wilson lower bound at
    CONFIDENCE is above the threshold; a gate without a share figure fails it as it stands."""
    if result.figure is None or result.threshold is None or not 0 <= result.figure <= 1 or n == 0:
        return True
    z = NormalDist().inv_cdf(CONFIDENCE)
    return wilson_lower(round(result.figure * n), n, z) > result.threshold


@dataclass(frozen=True)
class LatestCanary:
    """The latest canary evaluation of a dataset, as the instance stored it."""

    passed: bool
    config_hash: str
    description: str


def canary_stale(latest: LatestCanary | None, config_hash: str, *, ignore: bool) -> bool:
    """Whether a generation run must judge the canary again before paying: the latest canary was judged
    under another generation config (a changed temperature, a raised max_tokens), which says nothing of
    this one. With no canary at all the run proceeds (nothing was ever judged; `ignore_canary` skips it)."""
    return not ignore and latest is not None and latest.config_hash != config_hash


def canary_blocks(latest: LatestCanary | None, config_hash: str, *, ignore: bool, dataset: str) -> str:
    """Why a generation run must not start ("" when it may): the latest canary failed under this very
    generation config, and the run does not override it. A changed config is `canary_stale`: the run
    judges the canary again first."""
    if ignore or latest is None or latest.passed or latest.config_hash != config_hash:
        return ""
    return (f"{dataset}: refused before any request: its latest canary, under this generation config "
            f"({config_hash}), failed: {latest.description.removeprefix(f'{dataset}: ')} -- or set "
            f"{IGNORE_SETTING}: true in the run config to generate anyway")  # fmt: skip
