"""What a call says while it runs: the progress line every `progress_every` prompts (with the breaker's
pulse and the engine's own figures), a heartbeat while prompts are open, and the terminal bar."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from eagle_data.runner.dispatch import Dispatcher
from eagle_data.runner.progress import ProgressBar, Tally
from eagle_data.runner.settings import RunnerSettings
from eagle_data.types import Engine, Status


class Reporter:
    def __init__(
        self, name: str, settings: RunnerSettings, total: Tally, dispatch: Dispatcher, engine: Engine,
        say: Callable[[str], None],
    ) -> None:  # fmt: skip
        self.name, self.settings, self.total, self.dispatch, self.engine, self.say = (
            name, settings, total, dispatch, engine, say,
        )  # fmt: skip
        self.bar = ProgressBar(settings.progress_bar)
        self.finished = 0  # prompts this call finished, budget skips aside

    def line(self) -> str:
        """The standard line, the breaker's pulse, and the engine's own figures when it has any (an SGLang
        fleet's servers)."""
        extra = [line for line in (self.dispatch.admission.breaker.pulse(), self.engine.stats_line()) if line]
        return f"{self.name}: {self.total.line()}" + "".join(f" | {line}" for line in extra)

    def finished_one(self, status: Status) -> None:
        if status != "skipped_budget":
            self.finished += 1
            if self.finished % self.settings.progress_every == 0:
                self.say(self.line())
        self.bar.update(self.total, self.dispatch.admission.limiter.current, self.dispatch.in_flight())

    async def heartbeat_loop(self, busy: Callable[[], bool]) -> None:
        """A sign of life while prompts are open, even when nothing lands (a hung server, long backoff)."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_every_s)
            if busy():
                errors = sum(self.total.errors.values())
                # the breaker's pulse, and a slow server's line (the engine's) among them
                said = (self.dispatch.admission.breaker.pulse(), self.engine.stats_line())
                pulse = "".join(f", {line}" for line in said if line)
                self.say(
                    f"{self.name}: heartbeat: {self.dispatch.in_flight()}, {self.total.done}/{self.total.total} "
                    f"done, {errors} errors so far{pulse}"
                )
            self.bar.update(self.total, self.dispatch.admission.limiter.current, self.dispatch.in_flight(), force=True)

    def close(self) -> None:
        self.bar.close()
