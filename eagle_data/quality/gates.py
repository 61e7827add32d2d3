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
from eagle_data.quality.summary import Summary, share, summarize
from eagle_data.quality.verdicts import row_verdicts

# A loss-mask sum or a completion shared by two rows is chance in a small shard, not a regression.
MIN_DOMINANT_ROWS = 3
Figure = float | int | str
FAILED_RATE = "failed_rate"  # the gate a re-run can fix: failed rows are requested again
TRUNCATION_RATE = "truncation_rate"  # a warning at validation; the canary fails on it (eagle_data/quality/canary.py)


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
    previous_avg_completion_tokens: float | None = None  # from the last materialization, if any


def pct(x: float) -> str:
    return f"{x:.1%}"


def limit(x: float) -> str:
    """A threshold as people write it: 0.2 -> "20%", 0.005 -> "0.5%"."""
    return f"{x * 100:g}%"


def _result(
    d: CheckDef, passed: bool, figure: float | None, threshold: float | None, message: str, **details: Figure
) -> CheckResult:
    return CheckResult(d.name, passed, d.severity, d.blocking, figure, threshold, message, details)


def _empty_response(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    c = i.checks
    if not s.answered:  # nothing judged is no evidence of health: a shard of failures must not pass
        return _result(
            d, False, None, c.max_short_share,
            f"no answered rows to judge: {s.failed} of {s.rows} rows failed, "
            f"{s.rows - s.requested} skipped for budget; regenerate the shard",
        )  # fmt: skip
    snippet = s.top_repeat_text if len(s.top_repeat_text) <= 40 else s.top_repeat_text[:37] + "..."
    short = share(s.short, s.answered)
    same = share(s.top_loss_rows, s.completed) if s.top_loss_rows >= MIN_DOMINANT_ROWS else 0.0
    repeat = share(s.top_repeat_prompts, s.prompts) if s.top_repeat_prompts >= MIN_DOMINANT_ROWS else 0.0
    short_text = f"{pct(short)} of {s.answered} answered rows have loss-mask sum <= {c.min_loss_tokens}"
    same_text = (
        f"{pct(same)} of rows have loss-mask sum {s.top_loss_value}"
        if same
        else (f"no loss-mask sum is shared by {MIN_DOMINANT_ROWS} rows")
    )
    repeat_text = (
        f"{pct(repeat)} of prompts got the same completion {snippet!r}"
        if repeat
        else (f"no completion answers {MIN_DOMINANT_ROWS} prompts")
    )
    parts = [  # (figure, limit, one-line message)
        (short, c.max_short_share, f"{short_text} (limit {limit(c.max_short_share)})"),
        (same, c.max_same_loss_share, f"{same_text} (limit {limit(c.max_same_loss_share)})"),
        (repeat, c.max_repeat_share, f"{repeat_text} (limit {limit(c.max_repeat_share)})"),
    ]  # fmt: skip
    failing = [p for p in parts if p[0] > p[1]]
    if not failing and not s.train_rows:  # every answered row rejected: nothing to train on never passes
        verdicts = ", ".join(f"{v} {n}" for v, n in sorted(s.verdicts.items(), key=lambda kv: -kv[1]))
        return _result(
            d, False, None, c.max_short_share,
            f"the shard keeps no training row ({verdicts}); see its quality report, fix the cause and regenerate",
        )  # fmt: skip
    worst = max(failing or parts, key=lambda p: p[0] / p[1] if p[1] else float("inf"))
    message = "; ".join(text for _, _, text in failing or parts)
    return _result(
        d, not failing, worst[0], worst[1], message, short_share=short, top_loss_share=same, top_repeat_share=repeat
    )


def _lost_text(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    lim = i.checks.max_lost_text_share
    if not s.accounted:
        return _result(d, True, None, lim, f"no token counts to weigh: the engine reported none for {s.answered} rows")
    figure = share(s.lost_text, s.answered)
    ratio = share(s.reply_tokens, s.engine_tokens)
    return _result(
        d, figure <= lim, figure, lim,
        f"{pct(figure)} of {s.answered} answered rows lost text: their text holds under "
        f"{1 - i.checks.lost_text_tolerance:.0%} of the tokens the engine reported (limit {limit(lim)}); "
        f"text holds {ratio:.1%} of {s.engine_tokens:,} reported tokens over {s.accounted} rows",
        token_ratio=ratio, lost_text_rows=s.lost_text,
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
    figure, lim = share(s.truncated, s.answered), i.checks.max_truncated_share
    return _result(
        d,
        figure <= lim,
        figure,
        lim,
        f"{pct(figure)} of {s.answered} replies hit max_tokens (limit {limit(lim)})",
    )


def _failed_rate(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    """Blocking: the other gates judge only answered rows, so a shard of failures would otherwise pass and
    export its few good rows as if it were done."""
    figure, lim = share(s.failed, s.requested), i.checks.max_failed_share
    text = f"{pct(figure)} of {s.requested} requests failed (limit {limit(lim)})"
    if figure > lim:
        text += "; re-materialize the shard's generation: failed rows are requested again, answered ones reused"
    return _result(d, figure <= lim, figure, lim, text)


def _reasoning_present(d: CheckDef, s: Summary, i: Inputs) -> CheckResult:
    lim = i.checks.max_missing_reasoning_share
    if not i.thinking:
        return _result(d, True, None, lim, "thinking is off: no reasoning expected")
    figure = share(s.missing_reasoning, s.completed)
    return _result(
        d,
        figure <= lim,
        figure,
        lim,
        f"{pct(figure)} of {s.completed} completed rows have no reasoning while thinking is on (limit {limit(lim)})",
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
