"""Admission: whether one request may go out now, decided in one place.

It asks the three parts that may hold a request back, each once per decision: the adaptive in-flight limit
(`concurrency.py`: a slot, a server's pause), the budget (`budget.py`: the request's worst case held while it is
out) and the breaker (`breaker.py`: the verdict of each answered reply). It also says why sending stopped (a
budget, a fatal answer, the breaker). The dispatcher (`dispatch.py`) sends, retries and counts; it asks here
before every request and tells here what each answer was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from eagle_data.catalog import DatasetSpec
from eagle_data.runner import prices
from eagle_data.runner.breaker import Breaker
from eagle_data.runner.budget import Budget, Hold
from eagle_data.runner.concurrency import AdaptiveLimiter
from eagle_data.runner.settings import RunnerSettings
from eagle_data.types import Completion, Message, Status

TEMPLATE_BYTES = 8  # per message: the chat template's own tokens, in the prompt's worst case


def prompt_bytes(messages: list[Message]) -> int:
    """An upper bound on a request's prompt tokens: no token holds less than one byte."""
    return sum(len(m.get("content", "").encode()) + len(m.get("reasoning", "").encode()) + TEMPLATE_BYTES
               for m in messages)  # fmt: skip


class Admission:
    """One dataset's call: the in-flight limit, the budget and the breaker, and why sending stopped."""

    def __init__(
        self, spec: DatasetSpec, settings: RunnerSettings, max_tokens: int, say: Callable[[str], None]
    ) -> None:
        self.max_tokens, self.say = max_tokens, say
        self.limiter = AdaptiveLimiter(settings.initial_in_flight, settings.min_in_flight, settings.max_in_flight)
        self.budget = Budget(spec.name, spec.token_budget, spec.cost_budget_usd, price=prices.configured())
        self.breaker = Breaker(spec)
        self.landed = asyncio.Event()  # set (and replaced) when a request in flight landed: its hold is free
        self.waiting = 0  # turns waiting for their worst case to fit the budget
        self.stop_reason = ""
        self.stop_status: Status = "skipped_budget"

    def stop(self, reason: str, status: Status) -> None:
        self.stop_reason, self.stop_status = reason, status
        self.say(
            f"{reason}: stopped sending; letting {self.limiter.in_flight} in-flight requests land, "
            f"the rest are marked {status}"
        )

    @property
    def stopped_hard(self) -> bool:
        """Stopped for anything but a budget: not even a conversation under way sends again."""
        return bool(self.stop_reason) and self.stop_status != "skipped_budget"

    async def admit(self, asked: list[Message] | None) -> tuple[bool, Hold | None]:
        """A slot for a new prompt whose first request is `asked` (None: nothing to send), and that
        request's budget hold. (False, None) once sending has stopped or the budget is reached.
        Later turns of conversations under way go first: no new prompt is let in while one waits."""
        if self.stop_reason:
            return False, None
        await self.limiter.acquire()
        while self.waiting and not self.stop_reason:
            await self.landed.wait()
        fits, held = await self.reserve(asked) if asked is not None and not self.stop_reason else (True, None)
        if self.stop_reason or not fits:
            self.limiter.release()
            return False, None
        return True, held

    async def reserve(self, asked: list[Message]) -> tuple[bool, Hold | None]:
        """Hold a request's worst case before it is sent: wait until it fits beside those in flight. (False,
        None) when it cannot fit even with nothing in flight: sending stops for budget. (True, None) with no
        budget set. Every turn of a conversation goes through here, so none crosses the budget."""
        if not self.budget.limited:
            return True, None
        self.waiting += 1
        try:
            while True:
                if (held := self.budget.take(prompt_bytes(asked), self.max_tokens)) is not None:
                    return True, held
                if not self.budget.in_flight:
                    if not self.stop_reason:
                        self.stop(self.budget.reason(prompt_bytes(asked), self.max_tokens), "skipped_budget")
                    return False, None
                await self.landed.wait()
        finally:
            self.waiting -= 1
            self._signal()  # a prompt waiting behind this turn looks again

    async def send(self, asked: list[Message], held: Hold | None) -> tuple[int, Hold | None]:
        """Just before a request goes out: past any server-imposed pause; (the limiter's epoch, the request's
        hold: `held` from admission, else its worst case held now, so a retry is counted too)."""
        if self.limiter.paused_until:  # a server asked for a pause once: wait while it lasts
            await self.limiter.wait_unpaused()
        if held is None and self.budget.limited:
            held = self.budget.hold_worst(prompt_bytes(asked), self.max_tokens)
        return self.limiter.epoch, held

    def answered(self, prompt_id: str, done: Completion) -> str:
        """A reply landed: the limit grows, its tokens and dollars are spent, the breaker judges it; its verdict.
        A tripped breaker stops sending."""
        self.limiter.on_success()
        self.budget.settle(done)
        verdict, warning = self.breaker.judge(prompt_id, done)
        if warning:
            self.say(warning)
        if self.breaker.tripped and not self.stop_reason:
            self.stop(self.breaker.tripped, "failed")
        return verdict

    def release(self, held: Hold | None) -> None:
        """A request's hold is free again (it landed, or it was never sent)."""
        if held is not None:
            self.budget.release(*held)
            self._signal()

    def leave(self, held: Hold | None) -> None:
        """A prompt is done: its slot back, and a hold never sent (a stop came first) released."""
        self.limiter.release()
        self.release(held)

    def _signal(self) -> None:
        """Wake every waiter on a landing."""
        self.landed.set()
        self.landed = asyncio.Event()
