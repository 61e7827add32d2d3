"""Noticing a server that answers one request at a time, and counting the requests given up on it.

`transformers serve` (without `--continuous-batching`) answers its requests one after another: four sent
together to it on SmolLM2 came back after 5.8, 12.0, 17.1 and 23.0 s, in the order sent, where one alone took
5.7 s (docs/engines.md, "A server that answers one at a time"). With the runner's dozens in flight the last
ones reach the whole-request timeout; the client gives up, but the server goes on generating them while the
retries wait behind. So each OpenAI-compatible engine watches the first requests it sends (the run's own, no
extra request): once answers take long enough to matter (`TRIGGER_S`, or a twentieth of the timeout) and the
first `WAVE` of those sent together came back in the order sent, each after the ones before it (later than a
server working on them together could explain from their token counts), it says so in one line and sends one
request at a time from then on. Every request given up at the timeout is counted and said: the server may
still be generating it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

WAVE = 3  # answers of the first requests sent together needed to judge
TRIGGER_S = 1.0  # answers faster than this (and than TRIGGER_SHARE of the timeout) are never judged
TRIGGER_SHARE = 0.05


@dataclass(eq=False)
class _Sent:
    ticket: int
    at: float
    latency: float = 0.0
    tokens: int = 0


def one_at_a_time(answers: list[_Sent]) -> bool:
    """Whether the first answers to requests sent together (in the order they came back) show a server working
    on one at a time: they came back in the order sent, and the j-th one took at least (j+1)/2 times the first
    one's time and longer than a server working on them together would take (its reply's share of the first
    one's time per token), by half the difference to one after another."""
    if [a.ticket for a in answers] != list(range(answers[0].ticket, answers[0].ticket + len(answers))):
        return False
    first = answers[0]
    per_token = first.latency / max(first.tokens, 1)
    for j, answer in enumerate(answers[1:], start=2):
        tokens = sum(max(a.tokens, 1) for a in answers[:j])
        halfway = per_token * (tokens + max(answer.tokens, 1)) / 2
        if answer.latency < max(halfway, first.latency * (j + 1) / 2):
            return False
    return True


@dataclass
class Pacing:
    """One engine's watch over its server (the module's docstring): `start()` before each request, `done()`
    after. A wave is the requests sent from an idle start until the first of them is answered. `watch`: judge
    whether the server works one at a time (False: only count what is given up)."""

    timeout_s: float
    watch: bool = True
    serial: bool = False
    said: str = ""  # the one line naming what was seen
    abandoned: int = 0  # requests given up at the whole-request timeout
    _wave: list[_Sent] = field(default_factory=list)
    _answers: list[_Sent] = field(default_factory=list)  # the wave's, in the order they came back
    _judged: bool = False
    _tickets: int = 0
    _outstanding: int = 0
    _landed: asyncio.Event | None = None  # set (and replaced) when a request is over
    _loop: asyncio.AbstractEventLoop | None = None

    def _event(self) -> asyncio.Event:
        if self._landed is None or self._loop is not asyncio.get_running_loop():  # the runner opens a loop per run
            self._landed, self._loop = asyncio.Event(), asyncio.get_running_loop()
        return self._landed

    async def start(self) -> _Sent:
        """Wait for this request's turn (one at a time once the server is seen serial) and note its sending."""
        while self.serial and self._outstanding:
            await self._event().wait()
        if not self._outstanding and not self._judged:
            self._wave, self._answers = [], []  # an idle start: a new wave
        self._outstanding += 1
        self._tickets += 1
        sent = _Sent(self._tickets, time.monotonic())
        if self.watch and not self._answers and not self._judged:
            self._wave.append(sent)
        return sent

    def done(self, sent: _Sent, tokens: int | None = None, *, abandoned: bool = False) -> None:
        """The request is over: answered with `tokens` completion tokens, or failed (None), or given up at the
        timeout (`abandoned`)."""
        self.abandoned += abandoned
        self._outstanding -= 1
        if tokens is not None and self._wave and not self._judged:
            sent.latency, sent.tokens = time.monotonic() - sent.at, tokens
            self._judge(sent)
        if self._landed is not None:
            self._landed.set()
            self._landed = asyncio.Event()

    def _judge(self, answer: _Sent) -> None:
        if not any(answer is sent for sent in self._wave):
            self._judged = True  # sent after the wave's first answer, back before its WAVE-th: not one at a time
            return
        self._answers.append(answer)
        if len(self._wave) < WAVE or len(self._answers) < WAVE:
            return  # too few sent together (the next idle start opens a new wave), or too few back yet
        if self._answers[-1].latency < max(TRIGGER_S, TRIGGER_SHARE * self.timeout_s):
            return
        self._judged = True
        if one_at_a_time(self._answers):
            self.serial = True
            times = ", ".join(f"{a.latency:.1f}" for a in self._answers)
            self.said = (
                f"the server answers one request at a time ({len(self._answers)} sent together came back after "
                f"{times} s, in the order sent): sending one at a time (`transformers serve --continuous-batching` "
                "serves many)"
            )

    def line(self) -> str:
        """What was seen, in one line ("" when nothing was)."""
        gave_up = (
            f"{self.abandoned} request(s) given up at the {self.timeout_s:g} s timeout: the server may still be "
            "generating them while they are asked again"
            if self.abandoned
            else ""
        )
        return "; ".join(part for part in (self.said, gave_up) if part)
