"""Dataset-level checks: pure functions of a Summary and the catalog thresholds, one result each.

`CHECKS` are the registry's declarations of the gates (`quality.registry`, judge "gates"), each paired here
with the function that judges it; `run_checks` evaluates them all on one frame.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import polars as pl

from eagle_data.catalog import Checks
from eagle_data.quality import registry
from eagle_data.quality.registry import CheckDef, Severity
from eagle_data.quality.summary import Summary, lower_bound, share, summarize
from eagle_data.quality.verdicts import LOOP_NGRAM, row_verdicts

Figure = float | int | str
FAILED_RATE = "failed_rate"  # the gate a re-run can fix: failed rows are requested again
TRUNCATION_RATE = "truncation_rate"  # a warning at validation; the canary fails on it (eagle_data/quality/canary.py)
LOOPS = "loops"
# The most common loss-mask sum or completion is the top of many values: two rows sharing one is chance in a
# small shard, whatever its share, so a dominant value needs at least this many rows.
MIN_DOMINANT_ROWS = 3


@dataclass(frozen=True)
class CheckResult:
    """One check on one frame. `message` is one line with the figures, fit for an alert."""

    name: str
    passed: bool
    severity: Severity
    blocking: bool
    figure: float | None
    threshold: float | None
    message: str
    details: Mapping[str, Figure] = field(default_factory=dict)

    @property
    def alerts(self) -> bool:
        """Failed ERROR checks are announced (warnings only show in the UI and the report)."""
        return not self.passed and self.severity == "ERROR"

    def metadata(self) -> dict[str, Figure]:
        """Plain values for the check's metadata; `figure`/`threshold` are what alerts quote."""
        out: dict[str, Figure] = dict(self.details)
        if self.figure is not None:
            out["figure"] = self.figure
        if self.threshold is not None:
            out["threshold"] = self.threshold
        return out


@dataclass(frozen=True)
class Inputs:
    """Everything a check may read besides the frame."""

    checks: Checks
    thinking: bool
    previous_avg_completion_tokens: float | None = None  # the shard's own, when it was last validated, if ever


def pct(x: float) -> str:
    return f"{x:.1%}"


def limit(x: float) -> str:
    """A threshold as people write it: 0.2 -> "20%", 0.005 -> "0.5%"."""
    return f"{x * 100:g}%"


def _result(
    d: CheckDef, passed: bool, figure: float | None, threshold: float | None, message: str, **details: Figure
) -> CheckResult:
    return CheckResult(d.name, passed, d.severity, d.blocking, figure, threshold, message, details)


@dataclass(frozen=True)
class Share:
    """A share gate's reading: `hits` of `n` rows against `limit`. It fails only when the rows make it sure: the
    one-sided lower bound of the share at the catalog's `confidence` is over the limit, so one row of a 10-row
    shard cannot fail a 1% gate while 1.3% of 10,000 rows does."""

    hits: int
    n: int
    limit: float
    confidence: float

    @property
    def figure(self) -> float:
        return share(self.hits, self.n)

    @property
    def bound(self) -> float:
        return lower_bound(self.hits, self.n, self.confidence)

    @property
    def over(self) -> bool:
        return self.bound > self.limit

    def judged(self) -> str:
        """"limit 1%", and when the share is over it, whether the bound makes that sure."""
        text = f"limit {limit(self.limit)}"
        if self.figure <= self.limit:
            return text
        sure = "over it" if self.over else "not surely over it"
        return f"{text}; at least {pct(self.bound)} at {self.confidence:.1%} confidence: {sure}"


def _share(c: Checks, hits: int, n: int, lim: float) -> Share:
    return Share(hits, n, lim, c.confidence)


def _empty_response(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    c = i.checks
    replies = s.answered + s.empty_failed  # a row that failed on empty billed replies got replies: empty ones
    if not replies:  # nothing judged is no evidence of health: a shard of failures must not pass
        return _result(
            d, False, None, c.max_short_share,
            f"no answered rows to judge: {s.failed} of {s.rows} rows failed, "
            f"{s.rows - s.requested} skipped for budget; regenerate the shard",
        )  # fmt: skip
    snippet = s.top_repeat_text if len(s.top_repeat_text) <= 40 else s.top_repeat_text[:37] + "..."
    short = _share(c, s.short + s.empty_failed, replies, c.max_short_share)
    same = _share(c, s.top_loss_rows if s.top_loss_rows >= MIN_DOMINANT_ROWS else 0, s.completed, c.max_same_loss_share)
    repeat = _share(c, s.top_repeat_prompts if s.top_repeat_prompts >= MIN_DOMINANT_ROWS else 0, s.prompts,
                    c.max_repeat_share)  # fmt: skip
    failed_empty = f", {s.empty_failed} of them rows that failed after empty replies" if s.empty_failed else ""
    parts = [  # (share, one-line message)
        (short, f"{pct(short.figure)} of {replies} replies were empty or had loss-mask sum <= {c.min_loss_tokens}"
                f"{failed_empty} ({short.judged()})"),
        (same, (f"{pct(same.figure)} of {s.completed} complete replies have loss-mask sum {s.top_loss_value}"
                if same.hits else f"no loss-mask sum is shared by {MIN_DOMINANT_ROWS} complete replies")
         + f" ({same.judged()})"),
        (repeat, (f"{pct(repeat.figure)} of prompts got the same completion {snippet!r}"
                  if repeat.hits else f"no completion answers {MIN_DOMINANT_ROWS} prompts") + f" ({repeat.judged()})"),
    ]  # fmt: skip
    failing = [p for p in parts if p[0].over]
    if not failing and not s.train_rows:  # every answered row rejected: nothing to train on never passes
        verdicts = ", ".join(f"{v} {n}" for v, n in sorted(s.verdicts.items(), key=lambda kv: -kv[1]))
        return _result(
            d, False, None, c.max_short_share,
            f"the shard keeps no training row ({verdicts}); see its quality report, fix the cause and regenerate",
        )  # fmt: skip
    worst = max(failing or parts, key=lambda p: p[0].bound / p[0].limit if p[0].limit else float("inf"))[0]
    message = "; ".join(text for _, text in failing or parts)
    return _result(
        d, not failing, worst.figure, worst.limit, message,
        short_share=short.figure, top_loss_share=same.figure, top_repeat_share=repeat.figure,
    )  # fmt: skip


def _share_gate(
    d: CheckDef, g: Share, what: str, advice: str = "", note: str = "", **details: Figure
) -> CheckResult:
    """A gate of one share: `what` completes "12.0% of 50 ..."; `note` always follows, `advice` a failure."""
    text = f"{pct(g.figure)} of {g.n} {what} ({g.judged()}){note}"
    return _result(d, not g.over, g.figure, g.limit, text + (advice if g.over else ""), bound=g.bound, **details)


def _lost_text(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    lim = i.checks.max_lost_text_share
    if not s.accounted and not s.lost_failed:
        return _result(d, True, None, lim, f"no token counts to weigh: the engine reported none for {s.answered} rows")
    ratio = share(s.reply_tokens, s.engine_tokens)
    failed = f" ({s.lost_failed} failed after such replies)" if s.lost_failed else ""
    return _share_gate(
        d, _share(i.checks, s.lost_text + s.lost_failed, s.answered + s.lost_failed, lim),
        f"replies lost text{failed}: their text holds under {1 - i.checks.lost_text_tolerance:.0%} of the tokens "
        "the engine reported",
        note=f"; text holds {ratio:.1%} of {s.engine_tokens:,} reported tokens over {s.accounted} rows",
        token_ratio=ratio, lost_text_rows=s.lost_text,
    )  # fmt: skip


def _loops(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    return _share_gate(
        d, _share(i.checks, s.loops, s.answered, i.checks.max_loop_share),
        f"answered replies loop (half or more of their {LOOP_NGRAM}-token phrases repeat earlier ones)",
        "; the model repeats itself: check its sampling settings (temperature, repetition penalty) or the model",
    )  # fmt: skip


def _token_structure(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    bad = sum(s.structure.values())
    if not bad:
        return _result(d, True, 0, 0, f"all {s.answered} answered rows have valid token structure")
    reasons = ", ".join(f"{r} {n}" for r, n in s.structure.items())
    return _result(
        d,
        False,
        bad,
        0,
        f"{bad} of {s.rows} rows have broken token structure ({reasons}; e.g. prompt_id {s.first_bad_prompt})",
        **s.structure,
    )


def _truncation_rate(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    return _share_gate(
        d, _share(i.checks, s.truncated, s.answered, i.checks.max_truncated_share), "replies hit max_tokens"
    )


def _failed_rate(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    """Blocking: the other gates judge only answered rows, so a shard of failures would otherwise pass and
    export its few good rows as if it were done. Failures on empty replies are also the empty_response gate's."""
    empty = f", {s.empty_failed} of them after empty replies (see empty_response)" if s.empty_failed else ""
    return _share_gate(
        d, _share(i.checks, s.failed, s.requested, i.checks.max_failed_share), f"requests failed{empty}",
        "; re-materialize the shard's generation: failed rows are requested again, answered ones reused",
    )  # fmt: skip


def _reasoning_present(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    lim = i.checks.max_missing_reasoning_share
    if not i.thinking:
        return _result(d, True, None, lim, "thinking is off: no reasoning expected")
    return _share_gate(
        d, _share(i.checks, s.missing_reasoning, s.completed, lim),
        "completed rows have no reasoning while thinking is on",
    )


def _length_shift(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    lim, prev, cur = i.checks.max_length_shift, i.previous_avg_completion_tokens, s.avg_completion_tokens
    if cur is None:
        return _result(d, True, None, lim, "no answered rows")
    if not prev:
        return _result(
            d,
            True,
            None,
            lim,
            f"average completion length {cur:,.1f} tokens; no previous figure",
            avg_completion_tokens=cur,
        )
    shift = (cur - prev) / prev
    return _result(
        d,
        abs(shift) <= lim,
        shift,
        lim,
        f"average completion length {cur:,.1f} tokens vs {prev:,.1f} last time ({shift:+.1%}, limit ±{limit(lim)})",
        avg_completion_tokens=cur,
        previous_avg_completion_tokens=prev,
    )


_Impl = Callable[[CheckDef, Summary, Inputs], CheckResult]
_JUDGES: dict[str, _Impl] = {
    "empty_response": _empty_response,
    "token_structure": _token_structure,
    "lost_text": _lost_text,
    TRUNCATION_RATE: _truncation_rate,
    FAILED_RATE: _failed_rate,
    "reasoning_present": _reasoning_present,
    "length_shift": _length_shift,
    LOOPS: _loops,
}
CHECKS: tuple[CheckDef, ...] = registry.implemented("gates", _JUDGES)


def evaluate(summary: Summary, inputs: Inputs) -> list[CheckResult]:
    """Every check on one summary, in CHECKS order."""
    return [_JUDGES[d.name](d, summary, inputs) for d in CHECKS]


def run_checks(frame: pl.DataFrame, inputs: Inputs) -> list[CheckResult]:
    """Every check on a validated frame (verdicts are added when the frame has none yet)."""
    if "verdict" not in frame.columns:
        frame = row_verdicts(frame, inputs.checks, inputs.thinking)
    return evaluate(summarize(frame, inputs.checks), inputs)


def _closeness(r: CheckResult) -> float:
    """How near a passing result came to its limit (figure over threshold)."""
    return abs(r.figure) / r.threshold if r.figure is not None and r.threshold else 0.0


def combine(per_shard: Mapping[str, Sequence[CheckResult]]) -> list[CheckResult]:
    """One result per check (in CHECKS order) from per-shard results.

    A check fails when it fails on any shard: the result quotes the first failing shard and says how
    many failed, so one bad shard cannot hide among good ones. A check passing everywhere quotes the
    shard that came closest to its limit.
    """
    keys = sorted(per_shard)
    if len(keys) == 1:
        return list(per_shard[keys[0]])
    by_name = {key: {r.name: r for r in per_shard[key]} for key in keys}
    out = []
    for d in CHECKS:
        column = [(key, by_name[key][d.name]) for key in keys if d.name in by_name[key]]
        if not column:
            continue
        failing = [(key, r) for key, r in column if not r.passed]
        if failing:
            key, first = failing[0]
            more = f" ({len(failing)} of {len(keys)} shards fail)" if len(failing) > 1 else ""
            out.append(replace(first, message=f"shard {key}: {first.message}{more}"))
        else:
            key, closest = max(column, key=lambda kr: _closeness(kr[1]))
            out.append(
                replace(closest, message=f"all {len(keys)} shards pass; closest, shard {key}: {closest.message}")
            )
    return out
