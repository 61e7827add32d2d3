"""The dispatcher: every request of a call goes through it. It owns the adaptive in-flight limit, the
retry policy, the budget (each request held at its worst case while out) and the breaker (each answered
reply judged on arrival), and says why sending stopped: a budget, a fatal answer, the breaker."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from typing import Any

from eagle_data.catalog import DatasetSpec
from eagle_data.quality.reply import BILLED_REJECTS, EMPTY
from eagle_data.runner import mixture, prices
from eagle_data.runner.breaker import Breaker
from eagle_data.runner.budget import Budget, Hold
from eagle_data.runner.concurrency import AdaptiveLimiter
from eagle_data.runner.progress import Tally
from eagle_data.runner.retry import retry_delay, should_retry
from eagle_data.runner.rows import Row, build_row
from eagle_data.runner.settings import RunnerSettings
from eagle_data.types import AbortError, Completion, Engine, EngineError, Message, RetryableError, Status

TEMPLATE_BYTES = 8  # per message: the chat template's own tokens, in the prompt's worst case


def prompt_bytes(messages: list[Message]) -> int:
    """An upper bound on a request's prompt tokens: no token holds less than one byte."""
    return sum(len(m.get("content", "").encode()) + len(m.get("reasoning", "").encode()) + TEMPLATE_BYTES
               for m in messages)  # fmt: skip


class Dispatcher:
    def __init__(
        self, engine: Engine, spec: DatasetSpec, settings: RunnerSettings, max_tokens: int, total: Tally,
        say: Callable[[str], None],
    ) -> None:  # fmt: skip
        self.engine, self.spec, self.settings, self.max_tokens, self.total, self.say = (
            engine, spec, settings, max_tokens, total, say,
        )  # fmt: skip
        self.limiter = AdaptiveLimiter(settings.initial_in_flight, settings.min_in_flight, settings.max_in_flight)
        self.budget = Budget(spec.name, spec.token_budget, spec.cost_budget_usd, price=prices.configured())
        self.breaker = Breaker(spec)
        self.rng = random.Random()
        self.landed = asyncio.Event()  # set (and replaced) when a request in flight landed: its hold is free
        self.waiting = 0  # turns waiting for their worst case to fit the budget
        self.stop_reason = ""
        self.stop_status: Status = "skipped_budget"
        self.fatal: EngineError | None = None  # the abort that ended the call
        self.usable = 0  # replies received with text to train on
        self.said_wait = -float("inf")  # when a long Retry-After was last announced
        self.seen_kinds: set[str] = set()
        self.sent_at: dict[int, float] = {}  # request ticket -> send time, oldest first (the heartbeat's)
        self.tickets = itertools.count()

    def stop(self, reason: str, status: Status) -> None:
        self.stop_reason, self.stop_status = reason, status
        self.say(
            f"{reason}: stopped sending; letting {self.limiter.in_flight} in-flight requests land, "
            f"the rest are marked {status}"
        )

    def stopped_row(self, prompt_id: str) -> Row:
        """The row of a prompt never sent because sending stopped."""
        return build_row(
            prompt_id, self.stop_status, [], [], attempts=0, latency_s=0.0, error=self.stop_reason,
            finished_at=time.time(),
        )  # fmt: skip

    def figures(self) -> dict[str, Any]:
        """Why sending stopped, the breaker's window and the budget, for each shard's metadata."""
        return {
            "budget_stop": self.stop_reason if self.stop_status == "skipped_budget" else "",
            "breaker_stop": self.breaker.tripped,
            **{f"window_{verdict}_share": share for verdict, share in self.breaker.shares().items()},
            "token_budget": self.budget.max_tokens,
            "cost_budget_usd": self.budget.max_usd,
            "dataset_tokens_used": self.budget.tokens,
            "dataset_cost_used_usd": round(self.budget.usd, 6),
        }

    @property
    def stopped_hard(self) -> bool:
        """Stopped for anything but a budget: not even a conversation under way sends again."""
        return bool(self.stop_reason) and self.stop_status != "skipped_budget"

    async def admit(self, asked: list[Message] | None) -> tuple[bool, Hold | None]:
        """A slot for a new prompt whose first request is `asked` (None: nothing to send), and that
        request's budget hold (`reserve`). (False, None) once sending has stopped or the budget is reached.
        Later turns of conversations under way go first: no new prompt is let in while one waits."""
        if self.stop_reason:
            return False, None
        await self.limiter.acquire()
        while self.waiting and not self.stop_reason:
            await self._next_landing()
        held = await self.reserve(asked) if asked is not None and not self.stop_reason else None
        if self.stop_reason:
            self.limiter.release()
            return False, None
        return True, held

    async def reserve(self, asked: list[Message]) -> Hold | None:
        """Hold a request's worst case before it is sent: wait until it fits beside those in flight; when it
        cannot fit even with nothing in flight, stop for budget (None). None too with no budget set. Every
        turn of a conversation goes through here, so none crosses the budget."""
        if not self.budget.limited:
            return None
        self.waiting += 1
        try:
            while True:
                worst = self.budget.worst(prompt_bytes(asked), self.max_tokens)
                if self.budget.fits(*worst):
                    self.budget.hold(*worst)
                    return worst
                if not self.budget.in_flight:
                    if not self.stop_reason:
                        self.stop(self.budget.reason(*worst), "skipped_budget")
                    return None
                await self._next_landing()
        finally:
            self.waiting -= 1
            self._signal()  # a prompt waiting behind this turn looks again

    async def _next_landing(self) -> None:
        """Until a request in flight lands (its hold is free again) or a waiting turn is done waiting."""
        await self.landed.wait()

    def _signal(self) -> None:
        """Wake every waiter of `_next_landing`."""
        self.landed.set()
        self.landed = asyncio.Event()

    def leave(self, held: Hold | None) -> None:
        """A prompt is done: its slot back, and a hold never sent (a stop came first) released."""
        self.limiter.release()
        self._release(held)

    def _release(self, held: Hold | None) -> None:
        if held is not None:
            self.budget.release(*held)
            self._signal()

    async def complete(
        self, tally: Tally, asked: list[Message], prompt_id: str, held: Hold | None
    ) -> tuple[Completion | None, int, str]:
        """One reply with retries: (completion or None, attempts made, error text); `held` is the first
        attempt's hold from `admit`. A reply paid for but holding no usable text is asked again at most
        `breaker.empty_retries` times, never like an outage."""
        attempts = throttles = rejects = 0
        while True:
            if self.stopped_hard:  # nothing more is sent
                self._release(held)
                return None, attempts + throttles + rejects, f"stopped: {self.stop_reason}"
            await self.limiter.wait_unpaused()
            epoch = self.limiter.epoch
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
            self.limiter.on_success()
            if not (error := self._judge(tally, prompt_id, done)):
                self.usable += 1
                return done, attempts + throttles + rejects + 1, ""
            rejects += 1
            if rejects > self.spec.breaker.empty_retries or self.stop_reason:
                return None, attempts + throttles + rejects, error

    def _judge(self, tally: Tally, prompt_id: str, done: Completion) -> str:
        """Account for an answered reply and give the breaker its verdict; the error when the reply is a
        billed reject (counted as wasted), else ""."""
        self.budget.spend(done.prompt_tokens + done.completion_tokens, self.budget.cost_of(done))
        self.budget.learn(done)
        verdict, warning = self.breaker.judge(prompt_id, done)
        if warning:
            self.say(warning)
        if self.breaker.tripped and not self.stop_reason:
            self.stop(self.breaker.tripped, "failed")
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
        """One request, registered in flight while it is out (the heartbeat reports the oldest) and
        counted in the budget at its worst case (`held` at admission, else here) until it lands."""
        ticket = next(self.tickets)
        self.sent_at[ticket] = time.monotonic()
        if held is None and self.budget.limited:
            held = self.budget.worst(prompt_bytes(asked), self.max_tokens)
            self.budget.hold(*held)
        try:
            setting = mixture.assign(prompt_id, self.spec.generation.mixture, self.spec.generation.mixture_seed)
            chosen = {"sampling": setting} if setting else {}
            return await self.engine.complete(list(asked), prompt_id=prompt_id, **chosen)
        finally:
            del self.sent_at[ticket]
            self._release(held)

    def _on_error(self, tally: Tally, exc: EngineError, epoch: int, attempts: int, throttles: int) -> float | None:
        """Count the error and adapt the limit; the wait before the next attempt, or None to give up."""
        self._count_error(tally, exc.kind, str(exc))
        if isinstance(exc, RetryableError):
            if exc.retry_after:
                exc.retry_after = self._capped_wait(exc.retry_after)
            if exc.throttle:
                self.limiter.on_throttle(epoch, exc.retry_after)
            if should_retry(exc, attempts, throttles, self.settings):
                return retry_delay(exc, attempts + throttles, self.settings, self.rng)
        elif isinstance(exc, AbortError) and self.fatal is None:  # every later request would fail too
            self.fatal = exc
            self.stop(f"{self.spec.name}: {exc.kind}: {exc}", "failed")
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
