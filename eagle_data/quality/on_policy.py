"""On-policy figures: how much of a row's supervised text is what the target itself would have written.

A drafter learns to predict the target under the template it is served with, so rows the target would not
have produced (another model's replies, a rendering without the default system turn, a think block where the
server had thinking off) train a drafter that accepts little. One forward pass of the target over a row tells:
at each supervised position, the target's log-probability of the token there and its own top choice.

What the target's distribution *predicts* for those figures depends on how the replies were sampled: at
temperature 0 the argmax everywhere (agreement 1); at T > 0 each position's expected share of argmax tokens and
expected log-probability under the tempered, top-p-truncated distribution. Summed over a shard, observed minus
expected is a martingale under "these are the target's own replies", so the shard's shortfall is judged with a
one-sided bound (`judge`), for greedy and sampled runs alike, without trusting the server's word.

Pure: numpy and polars only (the scorers that run the target live in `eagle_data/engines/scoring.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from statistics import NormalDist
from typing import Any

import numpy as np
import polars as pl

from eagle_data.quality.summary import lower_bound

COLUMN = "on_policy"  # the validated shard's per-row struct (null on rows not scored)
LOCAL_ENGINE = "local"  # the embedded engine's kind (a row's `engine`, in its `sampling` config)
HF_TOP_K = 50  # transformers 5.24 generate()'s top_k when neither the call nor the checkpoint sets one
# Supervised tokens after a think block's closing token that still count as "right after" it.
AFTER_THINK = 2
FIRST, THINK, REST = 0, 1, 2  # where a supervised position sits (segments)
# A segment whose shortfall exceeds the rest's by this factor (plus the tolerance) names the cause.
CAUSE_FACTOR = 2.0
ROW_DTYPE = pl.Struct(
    {
        "scorer": pl.String,  # where the figures came from: transformers, sglang, vllm, capture
        "temperature": pl.Float64,  # the row's sampling settings the expectations were taken at
        "top_p": pl.Float64,
        "top_k": pl.Int32,  # 0: none
        "tokens": pl.Int32,  # supervised tokens scored
        "hits": pl.Int32,  # ... that are the target's top choice
        "expected_hits": pl.Float64,  # what the target's sampling distribution predicts for `hits`
        "logprob": pl.Float64,  # sum of the target's log-probabilities of the supervised tokens (T = 1)
        "expected_logprob": pl.Float64,  # its expectation under the sampling distribution
        "logprob_var": pl.Float64,  # its variance under the sampling distribution
        "first_tokens": pl.Int32,  # the first supervised token of each reply
        "first_hits": pl.Int32,
        "first_expected": pl.Float64,
        "think_tokens": pl.Int32,  # inside a think block, or right after its close
        "think_hits": pl.Int32,
        "think_expected": pl.Float64,
    }
)
PREFIX = "on_policy_"  # of every metadata figure
RAW = ("tokens", "hits", "expected_hits", "logprob", "expected_logprob")  # the sums shards add up
SUM_SUFFIX = {"logprob": "_sum", "expected_logprob": "_sum"}
SUMMED = tuple(name for name in ROW_DTYPE.to_schema() if name not in ("scorer", "temperature", "top_p", "top_k"))


@dataclass(frozen=True)
class SamplingPoint:
    """The sampling settings a row's reply was drawn at (temperature 0: greedy)."""

    temperature: float
    top_p: float = 1.0
    min_tokens: int = 0  # the end-of-turn token was blocked at a reply's first min_tokens positions
    top_k: int = 0  # 0: no top-k cut


def row_sampling(sampling: str | None, setting: str | None, default: SamplingPoint) -> SamplingPoint:
    """A row's settings from its generation columns: `sampling` (the engine's config as JSON) and
    `sampling_setting` (the mixture setting it drew), else `default` (the catalog's)."""
    try:
        config = json.loads(sampling) if sampling else {}
    except json.JSONDecodeError:
        config = {}
    if not isinstance(config, dict):
        config = {}
    chosen = next((m for m in config.get("mixture") or () if isinstance(m, dict) and m.get("name") == setting), {})
    temperature = chosen.get("temperature", config.get("temperature", default.temperature))
    top_p = chosen.get("top_p", config.get("top_p", default.top_p))
    min_tokens = config.get("min_tokens", default.min_tokens)
    # transformers' generate cuts to 50 tokens unless told otherwise: the embedded engine's rows were drawn so
    top_k = chosen.get(
        "top_k", config.get("top_k", HF_TOP_K if config.get("engine") == LOCAL_ENGINE else default.top_k)
    )
    return SamplingPoint(float(temperature or 0.0), float(top_p or 1.0), int(min_tokens or 0), int(top_k or 0))


@dataclass(frozen=True)
class Scored:
    """One row's supervised positions as a scorer saw them (arrays of the same length n).

    Attributes:
        tokens: the supervised token ids.
        token_logp: the target's log-probability (temperature 1) of each.
        top_ids: [n, k] the target's k most likely ids at each position, most likely first.
        top_logp: [n, k] their log-probabilities, descending.
        log_z: logsumexp(log p / T) over the whole vocabulary at the row's temperature, where the scorer saw the
            whole distribution; None: estimated from the top k and the mass they leave.
    """

    tokens: np.ndarray
    token_logp: np.ndarray
    top_ids: np.ndarray
    top_logp: np.ndarray
    log_z: np.ndarray | None = None


def expectations(
    top_logp: np.ndarray, point: SamplingPoint, log_z: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position: the chance the sampler draws the argmax, and the mean and variance of the drawn token's
    log-probability (temperature 1), under the target's distribution tempered by T, cut to its top_k tokens and
    then to the top_p nucleus of what is left (the order HF, vLLM and SGLang apply them). Exact where the
    nucleus lies within the k listed tokens and `log_z` is given; otherwise the unlisted mass counts as tokens
    as likely as the k-th."""
    n = top_logp.shape[0]
    if point.temperature <= 0:
        return np.ones(n), top_logp[:, 0].copy(), np.zeros(n)
    inv = 1.0 / point.temperature
    scaled = top_logp * inv
    listed = np.exp(top_logp).sum(axis=1)
    if log_z is None:  # each unlisted token is at most as likely as the k-th: p^(1/T) <= p * p_k^(1/T - 1)
        tail = np.clip(1.0 - listed, 0.0, None) * np.exp(top_logp[:, -1] * (inv - 1.0))
        log_z = np.log(np.exp(scaled).sum(axis=1) + tail)
    p = np.exp(scaled - log_z[:, None])
    unlisted = np.clip(1.0 - p.sum(axis=1), 0.0, None)
    if 0 < point.top_k <= top_logp.shape[1]:  # every token the sampler may draw is listed
        top_logp, p = top_logp[:, : point.top_k], p[:, : point.top_k]
        p, unlisted = p / p.sum(axis=1, keepdims=True), np.zeros(n)
    ahead = np.cumsum(p, axis=1) - p
    q = np.where(ahead < point.top_p, p, 0.0)
    tail_in = np.clip(point.top_p - q.sum(axis=1), 0.0, unlisted)
    total = q.sum(axis=1) + tail_in
    q, tail_in = q / total[:, None], tail_in / total
    last = top_logp[:, -1]
    mean = (q * top_logp).sum(axis=1) + tail_in * last
    var = (q * (top_logp - mean[:, None]) ** 2).sum(axis=1) + tail_in * (last - mean) ** 2
    return q[:, 0], mean, var


def without_token(scored: Scored, blocked: np.ndarray, token: int, point: SamplingPoint) -> Scored:
    """The distribution the sampler drew from where `token` was blocked (`blocked` positions: an end-of-turn
    id under min_tokens): that token's probability taken out and the rest renormalized. Every row keeps k - 1
    listed tokens, so a removed entry leaves no gap."""
    if not blocked.any():
        return scored
    removed = (scored.top_ids == token) & blocked[:, None]
    p_removed = np.where(removed, np.exp(scored.top_logp), 0.0).sum(axis=1)
    log_c = np.log(np.clip(1.0 - p_removed, 1e-12, None))
    order = np.argsort(np.where(removed, -np.inf, scored.top_logp), axis=1, kind="stable")[:, ::-1][:, :-1]
    top_ids = np.take_along_axis(scored.top_ids, order, axis=1)
    top_logp = np.take_along_axis(scored.top_logp, order, axis=1) - log_c[:, None]
    log_z = scored.log_z
    if log_z is not None and point.temperature > 0:
        inv = 1.0 / point.temperature
        log_z = np.log(np.clip(np.exp(log_z) - p_removed**inv, 1e-300, None)) - log_c * inv
    return Scored(scored.tokens, scored.token_logp - log_c, top_ids, top_logp, log_z)


def final_reply(loss_mask: Sequence[int]) -> list[int]:
    """The loss mask cut to the row's last reply (its last run of supervised tokens): the reply generated in the
    very context the row holds. An earlier turn was generated before later turns existed, and a template that
    rewrites history (Qwen3's drops earlier think blocks) renders it in another context than it was made in, so
    the target would not write it there, however much it is the target's own."""
    mask = [int(m) for m in loss_mask]
    end = max((i for i, m in enumerate(mask) if m), default=-1)
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return [1 if start <= i <= end and end >= 0 else 0 for i in range(len(mask))]


def reply_index(loss_mask: Sequence[int]) -> np.ndarray:
    """Each supervised position's index within its reply (a run of supervised tokens), for min_tokens."""
    out, run = [], 0
    for mask in loss_mask:
        if mask:
            out.append(run)
        run = run + 1 if mask else 0
    return np.asarray(out, dtype=np.int64)


def segments(input_ids: Sequence[int], loss_mask: Sequence[int], think: tuple[int, int] | None) -> np.ndarray:
    """Where each supervised position sits: FIRST (a reply's first supervised token), THINK (inside a think
    block, its markers included, or up to AFTER_THINK tokens after its close), or REST. `think`: the
    (open, close) ids of the target's think markers, None when its format has none."""
    out: list[int] = []
    inside, after, previous = False, 0, 0
    for token, mask in zip(input_ids, loss_mask, strict=True):
        opened = think is not None and token == think[0]
        closed = think is not None and token == think[1]
        in_think = inside or opened or closed or after > 0
        if mask:
            out.append(FIRST if not previous else THINK if in_think else REST)
        after = AFTER_THINK if closed else max(after - 1, 0) if not (inside or opened) else 0
        inside = (inside or opened) and not closed
        previous = mask
    return np.asarray(out, dtype=np.int8)


def row_figures(scored: Scored, labels: np.ndarray, point: SamplingPoint, scorer: str) -> dict[str, Any]:
    """One row's struct (ROW_DTYPE) from its scored positions and their segments."""
    hit_p, mean, var = expectations(scored.top_logp, point, scored.log_z)
    hits = scored.tokens == scored.top_ids[:, 0]
    first, think = labels == FIRST, labels == THINK
    return {
        "scorer": scorer, "temperature": point.temperature, "top_p": point.top_p, "top_k": point.top_k,
        "tokens": int(hits.size), "hits": int(hits.sum()), "expected_hits": float(hit_p.sum()),
        "logprob": float(scored.token_logp.sum()), "expected_logprob": float(mean.sum()),
        "logprob_var": float(var.sum()),
        "first_tokens": int(first.sum()), "first_hits": int(hits[first].sum()),
        "first_expected": float(hit_p[first].sum()),
        "think_tokens": int(think.sum()), "think_hits": int(hits[think].sum()),
        "think_expected": float(hit_p[think].sum()),
    }  # fmt: skip


@dataclass(frozen=True)
class Totals:
    """The per-row figures of many rows added up (a shard, a dataset, a capture shard)."""

    rows: int = 0
    sums: Mapping[str, float] = field(default_factory=dict)
    points: tuple[str, ...] = ()  # the distinct sampling settings, as "T=0.8 top_p=0.95"
    scorers: tuple[str, ...] = ()

    def get(self, name: str) -> float:
        return float(self.sums.get(name, 0.0))

    @property
    def agreement(self) -> float | None:
        tokens = self.get("tokens")
        return self.get("hits") / tokens if tokens else None

    @property
    def expected_agreement(self) -> float | None:
        tokens = self.get("tokens")
        return self.get("expected_hits") / tokens if tokens else None

    @property
    def mean_logprob(self) -> float | None:
        tokens = self.get("tokens")
        return self.get("logprob") / tokens if tokens else None

    @property
    def expected_logprob(self) -> float | None:
        tokens = self.get("tokens")
        return self.get("expected_logprob") / tokens if tokens else None

    def numbers(self) -> dict[str, float | int]:
        """Plain metadata: the sums (which add up across shards) and the shares and means they give."""
        out: dict[str, float | int] = {f"{PREFIX}rows": self.rows}
        out |= {sum_figure(name): round(self.get(name), 4) for name in RAW}
        for name in ("agreement", "expected_agreement", "mean_logprob", "expected_logprob"):
            if (value := getattr(self, name)) is not None:
                out[f"{PREFIX}{name.replace('expected_logprob', 'expected_mean_logprob')}"] = round(value, 4)
        return out


def sum_figure(name: str) -> str:
    """The metadata name of one of the RAW sums (`on_policy_tokens`, `on_policy_logprob_sum`)."""
    return f"{PREFIX}{name}{SUM_SUFFIX.get(name, '')}"


def totals(rows: Iterable[Mapping[str, Any] | None]) -> Totals:
    """Add up per-row structs (None: a row not scored)."""
    count, sums, points, scorers = 0, dict.fromkeys(SUMMED, 0.0), set(), set()
    for row in rows:
        if not row:
            continue
        count += 1
        for name in SUMMED:
            sums[name] += float(row.get(name) or 0.0)
        top_k = f" top_k={row['top_k']}" if row.get("top_k") else ""
        points.add(f"T={row['temperature']:g} top_p={row['top_p']:g}{top_k}")
        scorers.add(str(row.get("scorer") or ""))
    return Totals(count, sums, tuple(sorted(points)), tuple(sorted(scorers - {""})))


def frame_totals(frame: pl.DataFrame) -> Totals:
    """The totals of a validated frame's `on_policy` column (empty when it has none)."""
    return totals(frame[COLUMN].to_list()) if COLUMN in frame.columns else Totals()


@dataclass(frozen=True)
class Limits:
    """How far below the target's own prediction a shard may fall (the catalog's `[defaults.on_policy]`)."""

    agreement_tolerance: float = 0.05  # top-1 agreement, as a share of supervised tokens
    logprob_tolerance: float = 0.5  # mean log-probability per supervised token, nats
    confidence: float = 0.999


@dataclass(frozen=True)
class Verdict:
    """A judged total: pass/fail, the figure quoted against its threshold, one line, and the likely cause."""

    passed: bool
    figure: float | None  # the agreement shortfall: the miss share's bound minus the predicted miss share
    threshold: float | None
    line: str
    cause: str = ""  # "rendering", "thinking", "not_target", or "" when it passed
    details: Mapping[str, float | int | str] = field(default_factory=dict)


CAUSES = {
    "rendering": "the rows' rendering differs from the server's: the target disagrees already at the first reply "
    "token; compare the chat template (a default system turn, the generation prompt) with the one that generated",
    "thinking": "thinking on/off mismatch: the target disagrees inside or right after the think block; render "
    "with the thinking setting the server generated with",
    "not_target": "the replies are not the target's: it disagrees throughout; regenerate them with the target, "
    "or check which model the server serves",
}


def _shortfall(t: Totals, prefix: str) -> tuple[float, int]:
    n = int(t.get(f"{prefix}tokens"))
    hits, expected = ("hits", "expected_hits") if not prefix else (f"{prefix}hits", f"{prefix}expected")
    return ((t.get(expected) - t.get(hits)) / n if n else 0.0), n


def cause_of(t: Totals, limits: Limits) -> str:
    """Which segment falls short most: the first reply token, the think block, or all of it."""
    rest_tokens = t.get("tokens") - t.get("first_tokens") - t.get("think_tokens")
    rest_short = (
        (t.get("expected_hits") - t.get("first_expected") - t.get("think_expected")
         - (t.get("hits") - t.get("first_hits") - t.get("think_hits"))) / rest_tokens if rest_tokens else 0.0
    )  # fmt: skip
    bar = CAUSE_FACTOR * max(rest_short, 0.0) + limits.agreement_tolerance
    think, think_n = _shortfall(t, "think_")
    if think_n and think > bar:
        return "thinking"
    first, first_n = _shortfall(t, "first_")
    if first_n and first > bar:
        return "rendering"
    return "not_target"


def judge(t: Totals, limits: Limits, *, unscored: str = "") -> Verdict:
    """Fail when the supervised tokens' agreement with the target's top choice, or their mean log-probability,
    is surely (one-sided bound at `limits.confidence`) further below what the target's own sampling
    distribution predicts than the tolerance allows. `unscored`: why nothing was scored, when nothing was."""
    n = int(t.get("tokens"))
    if not n:
        return Verdict(True, None, limits.agreement_tolerance, f"on-policy: not scored ({unscored or 'no rows'})")
    z = NormalDist().inv_cdf(limits.confidence)
    misses, expected_miss = n - int(t.get("hits")), 1.0 - t.get("expected_hits") / n
    miss_bound = lower_bound(misses, n, limits.confidence)  # the miss share is surely at least this
    agreement_short = miss_bound - expected_miss
    lp_short = (t.get("expected_logprob") - t.get("logprob")) / n - z * math.sqrt(t.get("logprob_var")) / n
    passed = agreement_short <= limits.agreement_tolerance and lp_short <= limits.logprob_tolerance
    obs, exp = t.agreement or 0.0, t.expected_agreement or 0.0
    _first, first_n = _shortfall(t, "first_")
    text = (
        f"top-1 agreement {obs:.3f} over {n:,} supervised tokens of {t.rows} rows, the target's own distribution at "
        f"{', '.join(t.points)} predicts {exp:.3f} (tolerance {limits.agreement_tolerance:g}); mean log-probability "
        f"{t.mean_logprob:.3f} vs {t.expected_logprob:.3f} predicted (tolerance {limits.logprob_tolerance:g} nats)"
    )
    if first_n:
        text += f"; first reply tokens {t.get('first_hits') / first_n:.3f} vs {t.get('first_expected') / first_n:.3f}"
    details = {**t.numbers(), "scorer": ", ".join(t.scorers), "agreement_shortfall_bound": round(agreement_short, 4),
               "logprob_shortfall_bound": round(lp_short, 4)}  # fmt: skip
    if passed:
        return Verdict(True, round(agreement_short, 4), limits.agreement_tolerance, f"on-policy: {text}", "", details)
    cause = cause_of(t, limits)
    line = f"off-policy rows: {text}; likely cause: {CAUSES[cause]}"
    details = {**details, "cause": cause}
    return Verdict(False, round(agreement_short, 4), limits.agreement_tolerance, line, cause, details)


def limits_of(settings: Any) -> Limits:
    """The catalog's on-policy settings as judging limits (any object with the three fields)."""
    return Limits(*(getattr(settings, f.name) for f in fields(Limits)))


UNSCORED = (
    'no row of it was scored: scorer "auto" scores the embedded engine\'s rows; set [defaults.on_policy] scorer '
    "(transformers with checkpoint, sglang or vllm with url) to score another engine's, or capture hidden states"
)


def shard_verdict(frame: pl.DataFrame, limits: Limits) -> Verdict:
    """One validated shard's `on_policy` check from its stored column (a shard without one was not scored)."""
    return judge(frame_totals(frame), limits, unscored=UNSCORED)
