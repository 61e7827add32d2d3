"""`run_generation`: one event loop, one adaptive in-flight limit, every shard of a call.

Prompts flow through a single producer that takes a slot from the shared limiter before starting a
prompt; each prompt walks its user turns, retrying per the retry policy; finished rows go to the
shard's result log (durable every few seconds) and a finished shard is written whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

from eagle_data.catalog import DatasetSpec
from eagle_data.runner.budget import Budget
from eagle_data.runner.concurrency import AdaptiveLimiter
from eagle_data.runner.progress import ProgressBar, Tally
from eagle_data.runner.resultlog import ResultLog, resume_key, reusable, stored_usage
from eagle_data.runner.retry import retry_delay, should_retry
from eagle_data.runner.rows import Row, assistant_message, build_row, plan_turns, to_frame
from eagle_data.runner.settings import RunnerSettings
from eagle_data.storage import ShardStore
from eagle_data.types import Completion, Engine, EngineError, Message, RetryableError, Status

GC_GEN0_THRESHOLD = 50_000  # see _fewer_gc_passes

# Fatal kinds that every later request would hit too: stop sending instead of failing each prompt.
ABORT_KINDS = ("http_401", "http_403", "http_402_budget", "auth_missing")


@dataclass
class ShardReport:
    """What one partition ended with; `figures` is plain JSON-able data for Dagster metadata.
    `answered` holds (completion_tokens, finish_reason) of every ok or truncated row, so callers can
    judge truncation without reading the shard back."""

    partition: str
    uri: str
    figures: dict[str, Any]
    answered: list[tuple[int, str]]


class _Shard:
    def __init__(self, partition: str, prompts: pl.DataFrame, log: ResultLog, reused: dict[str, Row]) -> None:
        self.partition, self.log = partition, log
        self.order: list[str] = prompts["prompt_id"].to_list()
        self.rows: dict[str, Row] = reused
        self.todo = [
            p for p in prompts.select("prompt_id", "messages").iter_rows(named=True) if p["prompt_id"] not in reused
        ]
        self.open = len(self.todo)
        self.pending: list[Row] = []
        self.tally = Tally(total=len(self.order))
        self.lock = asyncio.Lock()
        self.finalizing = False


class _Run:
    def __init__(
        self,
        engine: Engine,
        spec: DatasetSpec,
        shards: dict[str, pl.DataFrame],
        store: ShardStore,
        settings: RunnerSettings,
        log: Callable[[str], None],
        write_shards: bool,
    ) -> None:
        self.write_shards = write_shards
        self.engine, self.spec, self.frames, self.store, self.settings, self.say = (
            engine,
            spec,
            shards,
            store,
            settings,
            log,
        )
        self.key = resume_key(engine.config(), spec)
        self.limiter = AdaptiveLimiter(settings.initial_in_flight, settings.min_in_flight, settings.max_in_flight)
        self.rng = random.Random()
        self.total = Tally(total=sum(f.height for f in shards.values()))
        self.budget = Budget(spec.name, spec.token_budget, spec.cost_budget_usd)
        self.bar = ProgressBar(settings.progress_bar)
        self.stop_reason = ""
        self.stop_status: Status = "skipped_budget"
        self.finished_new = 0
        self.seen_kinds: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.finalizers: list[asyncio.Task[None]] = []
        self.reports: dict[str, ShardReport] = {}
        self.flush_now = asyncio.Event()
        self.sent_at: dict[int, float] = {}  # request ticket -> send time, oldest first (the heartbeat's)
        self.tickets = itertools.count()

    # ---- the call ---------------------------------------------------------------------------------
    async def main(self) -> dict[str, ShardReport]:
        tokens, usd = await asyncio.to_thread(stored_usage, self.store, self.spec.name, set(self.frames))
        self.budget.spend(tokens, usd)
        shards = [await asyncio.to_thread(self._open, p, f) for p, f in self.frames.items()]
        self.say(
            f"{self.spec.name}: {self.total.total} prompts in {len(shards)} shards, "
            f"{self.total.reused} reused (config {self.key.config_hash}), engine {self.engine.name} "
            f"model {self.engine.model}"
        )
        if any(shard.todo for shard in shards):
            try:
                self.say(await self.engine.check())
            except BaseException:
                await self.engine.aclose()
                raise
        flusher = asyncio.create_task(self._flush_loop(shards))
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        try:
            await self._produce(shards)
            while self.tasks:
                await asyncio.gather(*self.tasks)
            await asyncio.gather(*self.finalizers)
        finally:
            flusher.cancel()
            heartbeat.cancel()
            self.bar.close()
            for shard in shards:  # interrupted (Ctrl-C, Dagster termination): keep what landed
                if shard.pending:
                    shard.log.write_part(shard.pending)
            await self.engine.aclose()
        self.total.ended = time.monotonic()
        self.say(self._progress_line())
        if self.stop_reason:
            self.say(self.stop_reason)
        return {p: self.reports[p] for p in self.frames}

    def _open(self, partition: str, prompts: pl.DataFrame) -> _Shard:
        log = ResultLog(self.store, self.spec.name, partition)
        stored = reusable(log.load(), self.key).filter(pl.col("prompt_id").is_in(prompts["prompt_id"].implode()))
        shard = _Shard(partition, prompts, log, {r["prompt_id"]: r for r in stored.iter_rows(named=True)})
        for row in shard.rows.values():
            for tally in (shard.tally, self.total):
                tally.add(row, reused=True)
            self.budget.spend(row["prompt_tokens"] + row["completion_tokens"], row["cost_usd"])
        return shard

    async def _produce(self, shards: list[_Shard]) -> None:
        loop = asyncio.get_running_loop()
        for shard in shards:
            for prompt in shard.todo:
                if not self.stop_reason:
                    await self.limiter.acquire()
                    if not self.stop_reason and (reason := self.budget.exhausted()):
                        self._stop(reason, "skipped_budget")
                    if self.stop_reason:
                        self.limiter.release()
                if self.stop_reason:
                    self._finish(shard, self._stopped_row(prompt["prompt_id"]))
                    continue
                task = loop.create_task(self._prompt(shard, prompt))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            self._maybe_finalize(shard)

    def _stop(self, reason: str, status: Status) -> None:
        self.stop_reason, self.stop_status = reason, status
        self.say(
            f"{reason}: stopped sending; letting {self.limiter.in_flight} in-flight requests land, "
            f"the rest are marked {status}"
        )

    def _stopped_row(self, prompt_id: str) -> Row:
        return build_row(
            prompt_id,
            self.stop_status,
            [],
            [],
            attempts=0,
            latency_s=0.0,
            error=self.stop_reason,
            finished_at=time.time(),
        )

    # ---- one prompt -------------------------------------------------------------------------------
    async def _prompt(self, shard: _Shard, prompt: dict[str, Any]) -> None:
        try:
            row = await self._generate(shard, prompt["prompt_id"], prompt["messages"])
        finally:
            self.limiter.release()
        self._finish(shard, row)

    async def _generate(self, shard: _Shard, prompt_id: str, messages: list[Message]) -> Row:
        started = time.monotonic()
        segments = plan_turns(messages, self.spec.regenerate, self.spec.max_turns)
        conversation: list[Message] = []
        replies: list[Completion] = []
        status: Status = "failed" if not segments else "ok"
        error = "" if segments else "bad_prompt: no user turn to answer"
        attempts = 0
        for segment in segments:
            # A budget stop lets a conversation already under way finish its turns: its paid replies
            # would be lost otherwise (a skipped row is regenerated whole). Other stops end it here.
            if replies and self.stop_reason and self.stop_status != "skipped_budget":
                status, error = self.stop_status, self.stop_reason
                break
            conversation.extend(segment)
            done, tries, error = await self._complete(shard, conversation, prompt_id)
            attempts += tries
            if done is None:
                status = "failed"
                break
            replies.append(done)
            conversation.append(assistant_message(done))
            self.budget.spend(done.prompt_tokens + done.completion_tokens, done.cost_usd)
            if done.truncated:
                status = "truncated"
                break
        return build_row(
            prompt_id,
            status,
            conversation,
            replies,
            attempts=attempts,
            latency_s=time.monotonic() - started,
            error=error,
            finished_at=time.time(),
        )

    async def _complete(
        self, shard: _Shard, conversation: list[Message], prompt_id: str
    ) -> tuple[Completion | None, int, str]:
        """One reply with retries: (completion or None, attempts made, error text)."""
        attempts = throttles = 0
        while True:
            await self.limiter.wait_unpaused()
            epoch = self.limiter.epoch
            shard.tally.requests += 1
            self.total.requests += 1
            try:
                done = await self._send(conversation, prompt_id)
            except EngineError as exc:
                throttled = isinstance(exc, RetryableError) and exc.throttle
                throttles += throttled
                attempts += not throttled
                delay = self._on_error(shard, exc, epoch, attempts, throttles)
                if delay is None:
                    return None, attempts + throttles, f"{exc.kind}: {exc}"
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # an engine bug: fail this prompt loudly, never retry it
                self._count_error(shard, "internal", f"{type(exc).__name__}: {exc}")
                return None, attempts + throttles + 1, f"internal: {type(exc).__name__}: {exc}"
            self.limiter.on_success()
            return done, attempts + throttles + 1, ""

    async def _send(self, conversation: list[Message], prompt_id: str) -> Completion:
        """One request, registered in flight while it is out (the heartbeat reports the oldest)."""
        ticket = next(self.tickets)
        self.sent_at[ticket] = time.monotonic()
        try:
            return await self.engine.complete(list(conversation), prompt_id=prompt_id)
        finally:
            del self.sent_at[ticket]

    def _on_error(self, shard: _Shard, exc: EngineError, epoch: int, attempts: int, throttles: int) -> float | None:
        """Count the error and adapt the limit; the wait before the next attempt, or None to give up."""
        self._count_error(shard, exc.kind, str(exc))
        if isinstance(exc, RetryableError):
            if exc.throttle:
                self.limiter.on_throttle(epoch, exc.retry_after)
            if should_retry(exc, attempts, throttles, self.settings):
                return retry_delay(exc, attempts + throttles, self.settings, self.rng)
        elif exc.kind.startswith(ABORT_KINDS) and not self.stop_reason:
            self._stop(f"{self.spec.name}: {exc.kind}: {exc}", "failed")
        return None

    def _count_error(self, shard: _Shard, kind: str, message: str) -> None:
        shard.tally.errors[kind] += 1
        self.total.errors[kind] += 1
        if kind not in self.seen_kinds:
            self.seen_kinds.add(kind)
            self.say(f"{self.spec.name}: first {kind} error: {message}")

    # ---- results ----------------------------------------------------------------------------------
    def _finish(self, shard: _Shard, row: Row) -> None:
        row.update(
            dataset=self.spec.name,
            config_hash=self.key.config_hash,
            base_hash=self.key.base_hash,
            max_tokens=self.key.max_tokens,
            engine=self.engine.name,
            model=self.engine.model,
        )
        shard.rows[row["prompt_id"]] = row
        shard.open -= 1
        shard.tally.add(row)
        self.total.add(row)
        if row["status"] != "skipped_budget":
            shard.pending.append(row)
            if len(shard.pending) >= self.settings.flush_every_rows:
                self.flush_now.set()
            self.finished_new += 1
            if self.finished_new % self.settings.progress_every == 0:
                self.say(self._progress_line())
        self.bar.update(self.total, self.limiter.current, self._in_flight())
        self._maybe_finalize(shard)

    def _progress_line(self) -> str:
        """The standard line, plus the engine's own figures when it has any (an SGLang fleet's servers)."""
        engine_line = getattr(self.engine, "stats_line", None)
        return f"{self.spec.name}: {self.total.line()}" + (f" | {engine_line()}" if engine_line else "")

    def _in_flight(self) -> str:
        """`12 in flight, oldest 31 s`: what the heartbeat and the bar show."""
        oldest = next(iter(self.sent_at.values()), None)
        age = f", oldest {time.monotonic() - oldest:.0f} s" if oldest is not None else ""
        return f"{len(self.sent_at)} in flight{age}"

    async def _heartbeat_loop(self) -> None:
        """A sign of life while prompts are open, even when nothing lands (a hung server, long backoff)."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_every_s)
            if self.tasks:
                errors = sum(self.total.errors.values())
                self.say(
                    f"{self.spec.name}: heartbeat: {self._in_flight()}, {self.total.done}/{self.total.total} done, "
                    f"{errors} errors so far"
                )
            self.bar.update(self.total, self.limiter.current, self._in_flight(), force=True)

    def _maybe_finalize(self, shard: _Shard) -> None:
        if shard.open == 0 and not shard.finalizing:
            shard.finalizing = True
            self.finalizers.append(asyncio.create_task(self._finalize(shard)))

    async def _finalize(self, shard: _Shard) -> None:
        async with shard.lock:
            if self.write_shards:
                frame = to_frame([shard.rows[p] for p in shard.order])
                uri = await asyncio.to_thread(shard.log.finalize, frame)
            else:  # a sample: rows stay in the result log, where the full run reuses them
                uri = await asyncio.to_thread(shard.log.write_part, shard.pending) if shard.pending else ""
            shard.pending = []
        shard.tally.ended = time.monotonic()
        figures = shard.tally.figures(self.limiter.current)
        figures.update(
            config_hash=self.key.config_hash,
            budget_stop=self.stop_reason,
            token_budget=self.budget.max_tokens,
            cost_budget_usd=self.budget.max_usd,
            dataset_tokens_used=self.budget.tokens,
            dataset_cost_used_usd=round(self.budget.usd, 6),
        )
        answered = [
            (row["completion_tokens"], row["finish_reason"])
            for row in shard.rows.values()
            if row["status"] in ("ok", "truncated")
        ]
        self.reports[shard.partition] = ShardReport(shard.partition, uri, figures, answered)
        t = shard.tally
        self.say(
            f"{self.spec.name} {shard.partition}: {t.ok} ok, {t.truncated} truncated, {t.failed} failed, "
            f"{t.skipped_budget} skipped_budget ({t.reused} reused) -> {uri}"
        )

    async def _flush_loop(self, shards: list[_Shard]) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush_now.wait(), self.settings.flush_every_s)
            self.flush_now.clear()
            for shard in shards:
                if shard.pending and not shard.finalizing:
                    async with shard.lock:
                        await self._flush(shard)

    async def _flush(self, shard: _Shard) -> None:
        rows, shard.pending = shard.pending, []
        try:
            await asyncio.to_thread(shard.log.write_part, rows)
        except Exception as exc:  # storage trouble must not kill the run: keep the rows, retry next tick
            shard.pending = rows + shard.pending
            self.say(f"{self.spec.name} {shard.partition}: checkpoint failed, retrying: {exc!r}")


@contextlib.contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """Run with far fewer cyclic-GC passes, restoring the settings after.

    At 2,000 in flight every request allocates a few dozen containers and the default gen-0
    threshold (700) sets off a collection every few requests, each scanning the live prompts and rows:
    measured, a third of the client's CPU. Objects alive at the start are frozen out of the scans.
    """
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def run_generation(
    engine: Engine,
    spec: DatasetSpec,
    shards: dict[str, pl.DataFrame],
    store: ShardStore,
    *,
    settings: RunnerSettings | None = None,
    log: Callable[[str], None] = print,
    write_shards: bool = True,
) -> dict[str, ShardReport]:
    """Regenerate the assistant replies of every prompt in `shards` (partition key -> prompts frame).

    Writes each finished shard to `store` as a generations frame, reuses rows a previous run made
    durable under the same resume key, and returns one report per partition. With `write_shards`
    False (a sample of a shard's prompts) the rows stay in the result log only, so no partial shard
    file ever looks finished. Closes the engine's loop-bound resources (`engine.aclose()`) at the
    end; engines reopen them lazily.
    """
    with _fewer_gc_passes():
        run = _Run(engine, spec, shards, store, settings or RunnerSettings(), log, write_shards)
        return asyncio.run(run.main())
