"""The breaker: every answered reply's verdict (eagle_data/quality/reply.py) over a rolling window per
dataset; a blocking verdict whose share is surely above its gate stops the run (docs/breaker.md).

"Surely": the one-sided Wilson lower bound of the window share (`quality.summary.lower_bound`, the bound the
shard gates and the canary use too) at the catalog's `breaker.confidence` must exceed the gate's threshold.
A plain share trips on noise (a healthy server with 0.8% empty replies puts 3 or more in 200 one window in
five, over a 1% gate); the bound does not, yet a server answering nothing trips it at `min_replies`. The
window rolls, so a server that turns bad after hours is caught within a few dozen replies. Truncation is a
warning gate: it is announced once, not stopped.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from eagle_data.catalog import DatasetSpec
from eagle_data.quality.reply import EMPTY, REPEAT, SHORT, reply_verdict
from eagle_data.quality.summary import lower_bound
from eagle_data.quality.verdicts import LOOP, LOST_TEXT, PASS, TRUNCATED
from eagle_data.types import Completion, UserError


class BreakerTripped(UserError, RuntimeError):
    """The replies of a run turned bad; the message is the one line the breaker said."""


@dataclass(frozen=True)
class Gate:
    """A verdict's limit: the catalog check it reads, and what to change when it trips."""

    setting: str  # the `checks` field holding the threshold
    advice: str


GATES: dict[str, Gate] = {
    EMPTY: Gate(
        "max_short_share", "the server returns no answer text: check the model, provider and reasoning settings"
    ),
    LOST_TEXT: Gate(
        "max_lost_text_share",
        "the server reports tokens its text does not hold: check the reply format (reasoning field) or switch provider",
    ),
    SHORT: Gate("max_short_share", "replies are too short to train on: check the model, prompts and system prompt"),
    REPEAT: Gate("max_repeat_share", "one completion answers many prompts: check the server and sampling settings"),
    LOOP: Gate("max_loop_share", "replies loop: check the sampling settings (temperature, repetition penalty)"),
    TRUNCATED: Gate("max_truncated_share", "replies are cut at max_tokens: raise generation.max_tokens"),
}
WARN_ONLY = frozenset({TRUNCATED})  # a warning gate in validation: announced, never stopped on
REJECTS = frozenset({EMPTY, LOST_TEXT, SHORT, LOOP})  # the pulse's "rejected" share
EXAMPLES = 3


class Breaker:
    """One dataset's window; `judge` each answered reply, then read `tripped` (a line, or "")."""

    def __init__(self, spec: DatasetSpec) -> None:
        self.spec, self.settings = spec, spec.breaker
        self.window: deque[tuple[str, str, int]] = deque()  # (prompt_id, verdict, hash of content or 0)
        self.verdicts: Counter[str] = Counter()
        self.texts: Counter[int] = Counter()
        self.tripped = ""
        self.warned: set[str] = set()

    def judge(self, prompt_id: str, done: Completion) -> tuple[str, str]:
        """(this reply's verdict, a warning line to show once or ""); sets `tripped` when a gate trips."""
        verdict = reply_verdict(done, self.spec.checks)
        text = hash(done.content) if verdict == PASS else 0  # completed replies, as validation counts repeats
        self.window.append((prompt_id, verdict, text))
        self.verdicts[verdict] += 1
        self.texts[text] += bool(text)
        if len(self.window) > self.settings.window:
            _, old, old_text = self.window.popleft()
            self.verdicts[old] -= 1
            if old_text:
                self.texts[old_text] -= 1
                if not self.texts[old_text]:
                    del self.texts[old_text]
        if not self.settings.enabled or len(self.window) < self.settings.min_replies:
            return verdict, ""
        warning = ""
        if verdict in GATES and self._over(verdict, self.verdicts[verdict]):
            warning = self._verdict_line(verdict, self.verdicts[verdict])
        elif text and self.texts[text] > 1 and self._over(REPEAT, self.texts[text]):
            warning = self._verdict_line(REPEAT, self.texts[text], text)
        if not warning:
            return verdict, ""
        if verdict in WARN_ONLY:
            if verdict in self.warned:
                return verdict, ""
            self.warned.add(verdict)
            return verdict, f"WARNING {warning}"
        self.tripped = self.tripped or warning
        return verdict, ""

    def _over(self, verdict: str, hits: int) -> bool:
        bound = lower_bound(hits, len(self.window), self.settings.confidence)
        return bound > getattr(self.spec.checks, GATES[verdict].setting)

    def _verdict_line(self, verdict: str, hits: int, text: int = 0) -> str:
        gate, n = GATES[verdict], len(self.window)
        ids = [p for p, v, t in reversed(self.window) if (t == text if text else v == verdict)][:EXAMPLES]
        threshold = getattr(self.spec.checks, gate.setting)
        what = "got one identical completion" if text else f"were {verdict}"
        return (
            f"{self.spec.name}: breaker: {hits / n:.1%} of the last {n} replies {what} "
            f"(checks.{gate.setting} {threshold:g}), e.g. {', '.join(ids)}; {gate.advice} "
            f"(or set [datasets.{self.spec.name}.breaker] enabled = false)"
        )

    def shares(self) -> dict[str, float]:
        """Share per verdict in the window (the pulse and the shard figures)."""
        n = len(self.window) or 1
        out = {v: round(self.verdicts[v] / n, 4) for v in (EMPTY, LOST_TEXT, SHORT, LOOP, TRUNCATED)}
        out[REPEAT] = round(max(self.texts.values(), default=0) / n, 4)
        return out

    def pulse(self) -> str:
        """`window 200: 0.5% rejected, 2.0% truncated` for the progress line and the heartbeat."""
        if not self.window:
            return ""
        n = len(self.window)
        rejected = sum(self.verdicts[v] for v in REJECTS) / n
        return f"window {n}: {rejected:.1%} rejected, {self.verdicts[TRUNCATED] / n:.1%} truncated"
