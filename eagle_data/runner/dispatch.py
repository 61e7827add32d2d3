"""The dispatcher: every request of a call goes through it. It sends, retries by the retry policy and counts;
whether a request may go out (the in-flight limit, the budget, the breaker) it asks admission (`admission.py`),
one place, before every request, and tells it each answer."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from typing import Any

from eagle_data.catalog import DatasetSpec
from eagle_data.quality.reply import BILLED_REJECTS, EMPTY
from eagle_data.runner import mixture
from eagle_data.runner.admission import Admission
from eagle_data.runner.budget import Hold
from eagle_data.runner.progress import Tally
from eagle_data.runner.retry import retry_delay, should_retry
from eagle_data.runner.rows import Row, build_row
from eagle_data.runner.settings import RunnerSettings
from eagle_data.types import AbortError, Completion, Engine, EngineError, Message, RetryableError


class Dispatcher:
    def __init__(
        self, engine: Engine, spec: DatasetSpec, settings: RunnerSettings, max_tokens: int, total: Tally,
        say: Callable[[str], None],
    ) -> None:  # fmt: skip
        self.engine, self.spec, self.settings, self.max_tokens, self.total, self.say = (
            engine, spec, settings, max_tokens, total, say,
        )  # fmt: skip
        self.admission = Admission(spec, settings, max_tokens, say)
        self.rng = random.Random()
        self.fatal: EngineError | None = None  # the abort that ended the call
        self.usable = 0  # replies received with text to train on
        self.said_wait = -float("inf")  # when a long Retry-After was last announced
        self.seen_kinds: set[str] = set()
        self.sent_at: dict[int, float] = {}  # request ticket -> send time, oldest first (the heartbeat's)
        self.tickets = itertools.count()

    def stopped_row(self, prompt_id: str) -> Row:
        """The row of a prompt never sent because sending stopped."""
        return build_row(
            prompt_id, self.admission.stop_status, [], [], attempts=0, latency_s=0.0, error=self.admission.stop_reason,
            finished_at=time.time(),
        )  # fmt: skip

    def figures(self) -> dict[str, Any]:
        """Why sending stopped, the breaker's window and the budget, for each shard's metadata."""
        a, budget = self.admission, self.admission.budget
        return {
            "budget_stop": a.stop_reason if a.stop_status == "skipped_budget" else "",
            "breaker_stop": a.breaker.tripped,
            **{f"window_{verdict}_share": share for verdict, share in a.breaker.shares().items()},
            "token_budget": budget.max_tokens,
            "cost_budget_usd": budget.max_usd,
            "dataset_tokens_used": budget.tokens,
            "dataset_cost_used_usd": round(budget.usd, 6),
        }

    async def complete(
        self, tally: Tally, asked: list[Message], prompt_id: str, held: Hold | None
    ) -> tuple[Completion | None, int, str]:
        """One reply with retries: (completion or None, attempts made, error text); `held` is the first
        attempt's hold from admission. A reply paid for but holding no usable text is asked again at most
        `breaker.empty_retries` times, never like an outage."""
        admission = self.admission
        attempts = throttles = rejects = 0
        while True:
            if admission.stopped_hard:  # nothing more is sent
                admission.release(held)
                return None, attempts + throttles + rejects, f"stopped: {admission.stop_reason}"
            epoch, held = await admission.send(asked, held)
            tally.requests += 1
            self.total.requests += 1
            try:
                done = await self._send(asked, prompt_id, held)
            except EngineError as exc:
                throttled = isinstance(exc, RetryableError) and exc.throttle
                throttles += throttled
                attempts += not throttled
                delay = self._on_error(tally, exc, epoch, attempts, throttles)
                if delay is None:
                    return None, attempts + throttles + rejects, f"{exc.kind}: {exc}"
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # an engine bug: fail this prompt loudly, never retry it
                self._count_error(tally, "internal", f"{type(exc).__name__}: {exc}")
                return None, attempts + throttles + rejects + 1, f"internal: {type(exc).__name__}: {exc}"
            finally:
                held = None
            if not (error := self._judge(tally, prompt_id, done)):
                self.usable += 1
                return done, attempts + throttles + rejects + 1, ""
            rejects += 1
            if rejects > self.spec.breaker.empty_retries or admission.stop_reason:
                return None, attempts + throttles + rejects, error

    def _judge(self, tally: Tally, prompt_id: str, done: Completion) -> str:
        """Tell admission of an answered reply; the error when the reply is a billed reject (counted as wasted),
        else ""."""
        verdict = self.admission.answered(prompt_id, done)
        if verdict not in BILLED_REJECTS:
            return ""
        for counts in (tally, self.total):
            counts.wasted += 1
            counts.wasted_usd += done.cost_usd
        if verdict == EMPTY:
            kind, text = "empty_reply", "no content" + ("" if done.reasoning.strip() else " or reasoning")
        else:
            kind, text = verdict, f"{len(done.content.encode()) + len(done.reasoning.encode())} bytes of text"
        message = f"{text} (finish_reason {done.finish_reason or 'none'}, {done.completion_tokens} completion tokens)"
        self._count_error(tally, kind, message)
        return f"{kind}: {message}"

    async def _send(self, asked: list[Message], prompt_id: str, held: Hold | None) -> Completion:
        """One request, registered in flight while it is out (the heartbeat reports the oldest), its budget hold
        released when it lands."""
        ticket = next(self.tickets)
        self.sent_at[ticket] = time.monotonic()
        try:
            setting = mixture.assign(prompt_id, self.spec.generation.mixture, self.spec.generation.mixture_seed)
            chosen = {"sampling": setting} if setting else {}
            return await self.engine.complete(list(asked), prompt_id=prompt_id, **chosen)
        finally:
            del self.sent_at[ticket]
            if held is not None:
                self.admission.release(held)

    def _on_error(self, tally: Tally, exc: EngineError, epoch: int, attempts: int, throttles: int) -> float | None:
        """Count the error and adapt the limit; the wait before the next attempt, or None to give up."""
        self._count_error(tally, exc.kind, str(exc))
        if isinstance(exc, RetryableError):
            if exc.retry_after:
                exc.retry_after = self._capped_wait(exc.retry_after)
            if exc.throttle:
                self.admission.limiter.on_throttle(epoch, exc.retry_after)
            if should_retry(exc, attempts, throttles, self.settings):
                return retry_delay(exc, attempts + throttles, self.settings, self.rng)
        elif isinstance(exc, AbortError) and self.fatal is None:  # every later request would fail too
            self.fatal = exc
            self.admission.stop(f"{self.spec.name}: {exc.kind}: {exc}", "failed")
        return None

    def _capped_wait(self, asked: float) -> float:
        """A server's Retry-After, capped at max_retry_wait_s; a long one is announced (at most once per
        heartbeat), so a wait is never silence."""
        wait = min(asked, self.settings.max_retry_wait_s)
        now = time.monotonic()
        if (asked > wait or wait >= self.settings.heartbeat_every_s) and (
            now - self.said_wait >= self.settings.heartbeat_every_s
        ):
            self.said_wait = now
            self.say(
                f"{self.spec.name}: provider asked to wait {asked:.0f} s (Retry-After); waiting {wait:g} s, then "
                f"retrying; set max_retry_wait_s to wait less, or max_throttle_waits=0 to fail these prompts instead"
            )
        return wait

    def _count_error(self, tally: Tally, kind: str, message: str) -> None:
        tally.errors[kind] += 1
        self.total.errors[kind] += 1
        if kind not in self.seen_kinds:
            self.seen_kinds.add(kind)
            self.say(f"{self.spec.name}: first {kind} error: {message}")

    def in_flight(self) -> str:
        """`12 in flight, oldest 31 s`: what the heartbeat and the bar show."""
        oldest = next(iter(self.sent_at.values()), None)
        age = f", oldest {time.monotonic() - oldest:.0f} s" if oldest is not None else ""
        return f"{len(self.sent_at)} in flight{age}"
