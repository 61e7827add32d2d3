"""`run_generation`: one event loop, one adaptive in-flight limit, every shard of a call.

A single producer walks the partitions in order. For each it takes the shard's lease (one writer per
shard; a shard another live run holds is deferred and waited for at the end), reads the prompts only
then (a range over 1,800 partitions holds just the shards in flight), and replays what the result log
already holds. Each remaining prompt takes a slot from the shared limiter and walks its user turns,
retrying per the retry policy; every answered turn goes to the shard's turn log, durable within
`flush_every_s`; a finished shard is written whole, its lease released and its rows dropped from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from eagle_data import provenance
from eagle_data.catalog import DatasetSpec
from eagle_data.engines import lookup
from eagle_data.engines.truncation import ReplyLengths
from eagle_data.quality.reply import BILLED_REJECTS, EMPTY
from eagle_data.runner import mixture
from eagle_data.runner.breaker import Breaker, BreakerTripped
from eagle_data.runner.budget import Budget
from eagle_data.runner.concurrency import AdaptiveLimiter
from eagle_data.runner.lease import Holder, LeaseLost, Leases
from eagle_data.runner.progress import ProgressBar, Tally
from eagle_data.runner.resultlog import (
    ResultLog,
    Turn,
    completion_of,
    replayable,
    resume_key,
    reusable,
    stored_usage,
    turn_record,
)
from eagle_data.runner.retry import retry_delay, should_retry
from eagle_data.runner.rows import Row, assistant_message, build_row, plan_turns
from eagle_data.runner.settings import RunnerSettings
from eagle_data.storage import ShardStore
from eagle_data.types import Completion, Engine, EngineError, FatalError, Message, RetryableError, Status

GC_GEN0_THRESHOLD = 50_000  # see _fewer_gc_passes
LEASE_POLL_S = 1.0  # how often a deferred shard's lease is tried again

# Fatal kinds that every later request would hit too (bad or missing key, no access, no budget, a model
# the server does not have): stop sending, keep what landed, then fail the call with the server's line.
ABORT_KINDS = ("http_401", "http_403", "http_402_budget", "http_404", "auth_missing", "model_mismatch", "config")


class LeaseHeld(RuntimeError):
    """Shards another live run kept generating for longer than this run would wait."""


class NothingAnswered(RuntimeError):
    """Requests were sent and every one failed: a step with no answer is never green."""


@dataclass
class ShardReport:
    """What one partition ended with; `figures` is plain JSON-able data for Dagster metadata."""

    partition: str
    uri: str
    figures: dict[str, Any]


@dataclass
class _Conversation:
    """One prompt's walk through its user turns: stored turns replayed first, then this run's."""

    prompt_id: str
    segments: list[list[Message]]
    turns: list[Turn] = field(default_factory=list)  # the records of every reply so far
    messages: list[Message] = field(default_factory=list)
    replies: list[Completion] = field(default_factory=list)
    attempts: int = 0
    latency_s: float = 0.0
    held: tuple[int, float | None] | None = None  # the budget held for its first request at dispatch

    def add(self, done: Completion, turn: Turn) -> None:
        self.messages.extend(self.segments[len(self.replies)])
        self.replies.append(done)
        self.messages.append(assistant_message(done))
        self.turns.append(turn)
        self.attempts += turn["attempts"]
        self.latency_s += turn["latency_s"]

    def replay(self, stored: list[Turn]) -> None:
        for turn in stored[: len(self.segments)]:
            if self.ended:
                break
            self.add(completion_of(turn), turn)

    @property
    def ended(self) -> bool:
        """Every turn answered, or the last one hit max_tokens (the conversation stops there)."""
        return bool(self.replies) and (len(self.replies) == len(self.segments) or self.replies[-1].truncated)

    def row(self, status: Status, error: str, finished_at: float | None = None) -> Row:
        status = "truncated" if status == "ok" and self.replies and self.replies[-1].truncated else status
        return build_row(
            self.prompt_id,
            status,
            self.messages,
            self.replies,
            attempts=self.attempts,
            latency_s=self.latency_s,
            error=error,
            finished_at=time.time() if finished_at is None else finished_at,
        )


class _Shard:
    """One partition while it is open; its rows are dropped once it is written."""

    def __init__(self, partition: str, log: ResultLog, order: list[str], rows: dict[str, Row]) -> None:
        self.partition, self.log, self.order = partition, log, order
        self.rows = rows
        self.reused = set(rows)
        self.todo: list[_Conversation] = []
        self.open = 0
        self.pending: list[Turn] = []  # answered turns not yet durable
        self.carry: list[Turn] = []  # turns of conversations that ended unfinished: kept for the next run
        self.tally = Tally(total=len(order))
        self.lock = asyncio.Lock()
        self.finalizing = False


class _Run:
    def __init__(
        self,
        engine: Engine,
        spec: DatasetSpec,
        shards: Mapping[str, pl.DataFrame],
        store: ShardStore,
        settings: RunnerSettings,
        log: Callable[[str], None],
        write_shards: bool,
        lengths: ReplyLengths,
        run_id: str,
        redo: Mapping[str, set[str]],
    ) -> None:
        self.engine, self.spec, self.frames, self.store, self.settings, self.say = (
            engine,
            spec,
            shards,
            store,
            settings,
            log,
        )
        self.write_shards, self.lengths, self.redo = write_shards, lengths, redo
        self.run_id = run_id or uuid.uuid4().hex
        self.key = resume_key(engine.config(), spec)
        self.sampling = provenance.sampling(engine.config())
        if spec.generation.mixture and not lookup(engine.name).mixtures:
            raise FatalError(
                f"{spec.name}: engine {engine.name} takes no per-request sampling settings; remove the catalog "
                "entry's generation.mixture or use an OpenAI-compatible engine (openai, openrouter)",
                kind="config",
            )
        self.leases = Leases(store, spec.name, self.run_id, settings.lease_ttl_s)
        self.limiter = AdaptiveLimiter(settings.initial_in_flight, settings.min_in_flight, settings.max_in_flight)
        self.rng = random.Random()
        # Exact once a shard is read; until then a lazily read shard counts as a full one.
        known = {p: f.height for p, f in shards.items()} if isinstance(shards, dict) else {}
        self.expected = {p: known.get(p, spec.shard_size) for p in shards}
        self.total = Tally(total=sum(self.expected.values()))
        self.budget = Budget(spec.name, spec.token_budget, spec.cost_budget_usd)
        self.landed = asyncio.Event()  # a request in flight landed: its budget hold is free again
        self.breaker = Breaker(spec)
        self.said_wait = -float("inf")  # when a long Retry-After was last announced
        self.usable = 0  # replies this run received with text to train on
        self.bar = ProgressBar(settings.progress_bar)
        self.stop_reason = ""
        self.stop_status: Status = "skipped_budget"
        self.fatal: EngineError | None = None  # the abort that ended the call
        self.lease_lost = ""
        self.checked = False
        self.finished_new = 0
        self.seen_kinds: set[str] = set()
        self.open_shards: dict[str, _Shard] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.finalizers: list[asyncio.Task[None]] = []
        self.reports: dict[str, ShardReport] = {}
        self.flush_now = asyncio.Event()
        self.sent_at: dict[int, float] = {}  # request ticket -> send time, oldest first (the heartbeat's)
        self.tickets = itertools.count()

    # ---- the call ---------------------------------------------------------------------------------
    async def main(self) -> dict[str, ShardReport]:
        tokens, usd = await asyncio.to_thread(stored_usage, self.store, self.spec.name)
        self.budget.spend(tokens, usd)
        self.say(
            f"{self.spec.name}: {len(self.frames)} shards, about {self.total.total} prompts "
            f"(config {self.key.config_hash}), engine {self.engine.name} model {self.engine.model}"
        )
        loops = [asyncio.create_task(loop()) for loop in (self._flush_loop, self._heartbeat_loop, self._lease_loop)]
        try:
            held = await self._produce()
            while self.tasks:
                await asyncio.gather(*self.tasks)
            await asyncio.gather(*self.finalizers)
        finally:
            for task in loops:
                task.cancel()
            self.bar.close()
            self._abandon()  # blocking on purpose: it must run even when the loop is being cancelled
            await self.engine.aclose()
        self.total.ended = time.monotonic()
        self.say(self._progress_line())
        if self.stop_reason:
            self.say(self.stop_reason)
        if self.fatal is not None:
            raise FatalError(self.stop_reason, kind=self.fatal.kind)
        if self.breaker.tripped:
            raise BreakerTripped(self.breaker.tripped)
        if self.lease_lost:
            raise LeaseLost(self.lease_lost)
        if held:
            now = time.time()
            raise LeaseHeld(
                f"{self.spec.name}: {len(held)} shard(s) still held by another run after waiting "
                f"lease_wait_s={self.settings.lease_wait_s:g} s: "
                + "; ".join(f"{p} by {h.describe(now)}" for p, h in sorted(held.items()))
                + "; every other shard is written: re-run once that run ends"
            )
        if self.total.requests and not self.usable:
            kinds = ", ".join(f"{k} x{n}" for k, n in self.total.errors.most_common(3))
            raise NothingAnswered(
                f"{self.spec.name}: every request failed, no usable reply ({self.total.failed} prompts "
                f"failed; {kinds}); check the server ({self.engine.describe()}) and re-run: failed rows are "
                "requested again"
            )
        return {p: self.reports[p] for p in self.frames}

    def _abandon(self) -> None:
        """Interrupted (Ctrl-C, Dagster termination) or done: keep what landed, free the leases."""
        for shard in self.open_shards.values():
            if shard.pending and self.leases.holds(shard.partition):
                shard.log.append_turns(shard.pending)
                shard.pending = []
        for partition in list(self.leases.held):
            self.leases.release(partition)

    async def _produce(self) -> dict[str, Holder]:
        """Every shard in order; those under another live run's lease at the end, waiting up to
        lease_wait_s for them. Returns the shards still held by others."""
        deferred: dict[str, Holder] = {}
        for partition in self.frames:
            if (holder := await asyncio.to_thread(self.leases.take, partition)) is not None:
                self.say(f"{self.spec.name} {partition}: held by {holder.describe(time.time())}; coming back to it")
                deferred[partition] = holder
                continue
            await self._produce_shard(partition)
        deadline, said = time.monotonic() + self.settings.lease_wait_s, time.monotonic()
        while deferred and time.monotonic() < deadline:
            await asyncio.sleep(LEASE_POLL_S)
            for partition in list(deferred):
                if (holder := await asyncio.to_thread(self.leases.take, partition)) is None:
                    del deferred[partition]
                    await self._produce_shard(partition)
                else:
                    deferred[partition] = holder
            if deferred and time.monotonic() - said >= self.settings.heartbeat_every_s:
                said, now = time.monotonic(), time.time()
                first, holder = next(iter(deferred.items()))
                self.say(
                    f"{self.spec.name}: waiting for {len(deferred)} shard(s) held by other runs, "
                    f"e.g. {first} by {holder.describe(now)}"
                )
        return deferred

    async def _produce_shard(self, partition: str) -> None:
        shard, height = await asyncio.to_thread(self._open, partition)
        self.open_shards[partition] = shard
        self.total.total += height - self.expected[partition]
        for row in shard.rows.values():
            for tally in (shard.tally, self.total):
                tally.add(row, reused=True)
        if shard.todo and not self.checked and not self.stop_reason:
            self.checked = True
            self.say(await self.engine.check())
        loop = asyncio.get_running_loop()
        for conversation in shard.todo:
            if not self.stop_reason:
                await self.limiter.acquire()
                if self.budget.limited and conversation.segments and not self.stop_reason:
                    await self._hold_budget(conversation)
                if self.stop_reason:
                    self.limiter.release()
            if self.stop_reason:
                self._finish(shard, self._stopped_row(conversation.prompt_id), conversation)
                continue
            task = loop.create_task(self._prompt(shard, conversation))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        shard.todo = []
        self._maybe_finalize(shard)

    def _open(self, partition: str) -> tuple[_Shard, int]:
        """Read the shard's prompts and what its result log holds (blocking; the lease is ours);
        returns the shard and its number of prompts."""
        prompts = self.frames[partition]
        log = ResultLog(self.store, self.spec.name, partition, self.run_id)
        ids, redo = prompts["prompt_id"], self.redo.get(partition, set())
        keep = ids.filter(~ids.is_in(list(redo)))
        stored = reusable(log.load(), self.key).filter(pl.col("prompt_id").is_in(keep.implode()))
        shard = _Shard(partition, log, ids.to_list(), {r["prompt_id"]: r for r in stored.iter_rows(named=True)})
        turns = {p: chain for p, chain in replayable(log.load_turns(), self.key).items() if p not in redo}
        for prompt in prompts.select("prompt_id", "messages").iter_rows(named=True):
            if prompt["prompt_id"] in shard.rows:
                continue
            conversation = _Conversation(
                prompt["prompt_id"], plan_turns(prompt["messages"], self.spec.regenerate, self.spec.max_turns)
            )
            conversation.replay(turns.get(conversation.prompt_id, []))
            if conversation.ended:  # every turn was stored: the row is rebuilt, nothing is sent
                row = conversation.row("ok", "", finished_at=conversation.turns[-1]["finished_at"])
                shard.rows[conversation.prompt_id] = self._stamp(row)
                shard.reused.add(conversation.prompt_id)
            else:
                shard.todo.append(conversation)
        shard.open = len(shard.todo)
        return shard, prompts.height

    async def _hold_budget(self, conversation: _Conversation) -> None:
        """Wait until the first request's worst case fits beside those in flight, then hold it;
        stop for budget when it cannot fit even with nothing in flight."""
        while not self.stop_reason:
            asked = conversation.messages + conversation.segments[len(conversation.replies)]
            worst = self.budget.worst(_prompt_bytes([asked]), self.key.max_tokens)
            if self.budget.fits(*worst):
                self.budget.hold(*worst)
                conversation.held = worst
                return
            if not self.budget.in_flight:
                self._stop(self.budget.reason(*worst), "skipped_budget")
                return
            self.landed.clear()
            await self.landed.wait()

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
    async def _prompt(self, shard: _Shard, conversation: _Conversation) -> None:
        try:
            row = await self._generate(shard, conversation)
        finally:
            self.limiter.release()
            if conversation.held is not None:  # held at dispatch, never sent (a stop came first)
                self.budget.release(*conversation.held)
                conversation.held = None
                self.landed.set()
        self._finish(shard, row, conversation)

    async def _generate(self, shard: _Shard, conversation: _Conversation) -> Row:
        if not conversation.segments:
            return conversation.row("failed", "bad_prompt: no user turn to answer")
        while not conversation.ended:
            # A budget stop lets a conversation already under way finish its turns: its paid replies
            # would be lost otherwise (a skipped row is regenerated whole). Other stops end it here.
            if conversation.replies and self.stop_reason and self.stop_status != "skipped_budget":
                return conversation.row(self.stop_status, self.stop_reason)
            index = len(conversation.replies)
            started = time.monotonic()
            asked = conversation.messages + conversation.segments[index]
            done, tries, error = await self._complete(shard, conversation, asked)
            if done is None:
                conversation.messages = asked
                conversation.attempts += tries
                return conversation.row("failed", error)
            turn = turn_record(conversation.prompt_id, index, self.key, done, tries, time.monotonic() - started)
            conversation.add(done, turn)
            shard.pending.append(turn)
            if len(shard.pending) >= self.settings.flush_every_rows:
                self.flush_now.set()
        return conversation.row("ok", "")

    async def _complete(
        self, shard: _Shard, conversation: _Conversation, asked: list[Message]
    ) -> tuple[Completion | None, int, str]:
        """One reply with retries: (completion or None, attempts made, error text). A reply paid for but
        holding no usable text is asked again at most `breaker.empty_retries` times, never like an outage."""
        attempts = throttles = rejects = 0
        prompt_id = conversation.prompt_id
        while True:
            if self.stop_reason and self.stop_status != "skipped_budget":  # stopped: nothing more is sent
                return None, attempts + throttles + rejects, f"stopped: {self.stop_reason}"
            await self.limiter.wait_unpaused()
            epoch = self.limiter.epoch
            shard.tally.requests += 1
            self.total.requests += 1
            held, conversation.held = conversation.held, None
            try:
                done = await self._send(asked, prompt_id, held)
            except EngineError as exc:
                throttled = isinstance(exc, RetryableError) and exc.throttle
                throttles += throttled
                attempts += not throttled
                delay = self._on_error(shard, exc, epoch, attempts, throttles)
                if delay is None:
                    return None, attempts + throttles + rejects, f"{exc.kind}: {exc}"
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # an engine bug: fail this prompt loudly, never retry it
                self._count_error(shard, "internal", f"{type(exc).__name__}: {exc}")
                return None, attempts + throttles + rejects + 1, f"internal: {type(exc).__name__}: {exc}"
            self.limiter.on_success()
            if not (error := self._judge(shard, prompt_id, done)):
                self.usable += 1
                return done, attempts + throttles + rejects + 1, ""
            rejects += 1
            if rejects > self.spec.breaker.empty_retries or self.stop_reason:
                return None, attempts + throttles + rejects, error

    def _judge(self, shard: _Shard, prompt_id: str, done: Completion) -> str:
        """Account for an answered reply and give the breaker its verdict; the error when the reply is a
        billed reject (counted as wasted), else ""."""
        self.budget.spend(done.prompt_tokens + done.completion_tokens, done.cost_usd)
        self.budget.learn(done)
        verdict, warning = self.breaker.judge(prompt_id, done)
        if warning:
            self.say(warning)
        if self.breaker.tripped and not self.stop_reason:
            self._stop(self.breaker.tripped, "failed")
        if verdict not in BILLED_REJECTS:
            return ""
        for tally in (shard.tally, self.total):
            tally.wasted += 1
            tally.wasted_usd += done.cost_usd
        if verdict == EMPTY:
            kind, text = "empty_reply", "no content" + ("" if done.reasoning.strip() else " or reasoning")
        else:
            kind, text = verdict, f"{len(done.content.encode()) + len(done.reasoning.encode())} bytes of text"
        message = f"{text} (finish_reason {done.finish_reason or 'none'}, {done.completion_tokens} completion tokens)"
        self._count_error(shard, kind, message)
        return f"{kind}: {message}"

    async def _send(
        self, conversation: list[Message], prompt_id: str, held: tuple[int, float | None] | None
    ) -> Completion:
        """One request, registered in flight while it is out (the heartbeat reports the oldest) and
        counted in the budget at its worst case (`held` at dispatch, else here) until it lands."""
        ticket = next(self.tickets)
        self.sent_at[ticket] = time.monotonic()
        if held is None and self.budget.limited:
            held = self.budget.worst(_prompt_bytes([conversation]), self.key.max_tokens)
            self.budget.hold(*held)
        try:
            setting = mixture.assign(prompt_id, self.spec.generation.mixture, self.spec.generation.mixture_seed)
            chosen = {"sampling": setting} if setting else {}
            return await self.engine.complete(list(conversation), prompt_id=prompt_id, **chosen)
        finally:
            del self.sent_at[ticket]
            if held is not None:
                self.budget.release(*held)
                self.landed.set()

    def _on_error(self, shard: _Shard, exc: EngineError, epoch: int, attempts: int, throttles: int) -> float | None:
        """Count the error and adapt the limit; the wait before the next attempt, or None to give up."""
        self._count_error(shard, exc.kind, str(exc))
        if isinstance(exc, RetryableError):
            if exc.retry_after:
                exc.retry_after = self._capped_wait(exc.retry_after)
            if exc.throttle:
                self.limiter.on_throttle(epoch, exc.retry_after)
            if should_retry(exc, attempts, throttles, self.settings):
                return retry_delay(exc, attempts + throttles, self.settings, self.rng)
        elif exc.kind.startswith(ABORT_KINDS) and self.fatal is None:
            self.fatal = exc
            self._stop(f"{self.spec.name}: {exc.kind}: {exc}", "failed")
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

    def _count_error(self, shard: _Shard, kind: str, message: str) -> None:
        shard.tally.errors[kind] += 1
        self.total.errors[kind] += 1
        if kind not in self.seen_kinds:
            self.seen_kinds.add(kind)
            self.say(f"{self.spec.name}: first {kind} error: {message}")

    # ---- results ----------------------------------------------------------------------------------
    def _stamp(self, row: Row) -> Row:
        row.update(
            dataset=self.spec.name,
            config_hash=self.key.config_hash,
            base_hash=self.key.base_hash,
            max_tokens=self.key.max_tokens,
            engine=self.engine.name,
            model=self.engine.model,
            sampling=self.sampling,
            sampling_setting=getattr(
                mixture.assign(row["prompt_id"], self.spec.generation.mixture, self.spec.generation.mixture_seed),
                "name",
                "",
            ),
        )
        return row

    def _finish(self, shard: _Shard, row: Row, conversation: _Conversation) -> None:
        shard.rows[row["prompt_id"]] = self._stamp(row)
        if row["status"] not in ("ok", "truncated"):
            shard.carry.extend(conversation.turns)  # paid turns of an unfinished conversation stay
        shard.open -= 1
        shard.tally.add(row)
        self.total.add(row)
        if row["status"] != "skipped_budget":
            self.finished_new += 1
            if self.finished_new % self.settings.progress_every == 0:
                self.say(self._progress_line())
        self.bar.update(self.total, self.limiter.current, self._in_flight())
        self._maybe_finalize(shard)

    def _progress_line(self) -> str:
        """The standard line, plus the engine's own figures when it has any (an SGLang fleet's servers)."""
        extra = [line for line in (self.breaker.pulse(), self.engine.stats_line()) if line]
        return f"{self.spec.name}: {self.total.line()}" + "".join(f" | {line}" for line in extra)

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
                pulse = f", {line}" if (line := self.breaker.pulse()) else ""
                self.say(
                    f"{self.spec.name}: heartbeat: {self._in_flight()}, {self.total.done}/{self.total.total} done, "
                    f"{errors} errors so far{pulse}"
                )
            self.bar.update(self.total, self.limiter.current, self._in_flight(), force=True)

    def _maybe_finalize(self, shard: _Shard) -> None:
        if shard.open == 0 and not shard.finalizing:
            shard.finalizing = True
            self.finalizers.append(asyncio.create_task(self._finalize(shard)))

    async def _finalize(self, shard: _Shard) -> None:
        async with shard.lock:
            if not self.leases.holds(shard.partition):  # taken over: the other run writes this shard
                uri = ""
            elif self.write_shards:
                rows = [shard.rows[p] for p in shard.order]
                uri = await asyncio.to_thread(shard.log.finalize, rows, shard.carry, whole=True)
            else:  # a sample: rows stay in the result log, where the full run reuses them
                rows = [r for p, r in shard.rows.items() if p not in shard.reused and r["status"] != "skipped_budget"]
                uri = await asyncio.to_thread(shard.log.finalize, rows, shard.carry, whole=False)
            shard.pending = []
            await asyncio.to_thread(self.leases.release, shard.partition)
        for row in shard.rows.values():
            if row["status"] in ("ok", "truncated"):
                self.lengths.add(row["completion_tokens"], row["finish_reason"])
        del self.open_shards[shard.partition]
        shard.rows, shard.carry = {}, []
        shard.tally.ended = time.monotonic()
        figures = shard.tally.figures(self.limiter.current)
        figures.update(
            config_hash=self.key.config_hash,
            budget_stop=self.stop_reason if self.stop_status == "skipped_budget" else "",
            breaker_stop=self.breaker.tripped,
            **{f"window_{verdict}_share": share for verdict, share in self.breaker.shares().items()},
            token_budget=self.budget.max_tokens,
            cost_budget_usd=self.budget.max_usd,
            dataset_tokens_used=self.budget.tokens,
            dataset_cost_used_usd=round(self.budget.usd, 6),
        )
        self.reports[shard.partition] = ShardReport(shard.partition, uri, figures)
        t = shard.tally
        self.say(
            f"{self.spec.name} {shard.partition}: {t.ok} ok, {t.truncated} truncated, {t.failed} failed, "
            f"{t.skipped_budget} skipped_budget ({t.reused} reused) -> {uri}"
        )

    async def _flush_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush_now.wait(), self.settings.flush_every_s)
            self.flush_now.clear()
            for shard in list(self.open_shards.values()):
                if shard.pending and not shard.finalizing:
                    async with shard.lock:
                        await self._flush(shard)

    async def _flush(self, shard: _Shard) -> None:
        turns, shard.pending = shard.pending, []
        try:
            await asyncio.to_thread(shard.log.append_turns, turns)
        except Exception as exc:  # storage trouble must not kill the run: keep the turns, retry next tick
            shard.pending = turns + shard.pending
            self.say(f"{self.spec.name} {shard.partition}: checkpoint failed, retrying: {exc!r}")

    async def _lease_loop(self) -> None:
        """Renew the held leases; a lost one stops the run (another run is generating that shard)."""
        while True:
            await asyncio.sleep(self.settings.lease_ttl_s / 3)
            try:
                await asyncio.to_thread(self.leases.renew)
            except LeaseLost as exc:
                self.lease_lost = str(exc)
                if not self.stop_reason:
                    self._stop(str(exc), "failed")


def _prompt_bytes(turns: list[list[Message]]) -> int:
    """An upper bound on a request's prompt tokens: no token holds less than one byte; a few per message
    for the chat template's own tokens."""
    return sum(len(m.get("content", "").encode()) + len(m.get("reasoning", "").encode()) + 8 for t in turns for m in t)


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
    shards: Mapping[str, pl.DataFrame],
    store: ShardStore,
    *,
    settings: RunnerSettings | None = None,
    log: Callable[[str], None] = print,
    write_shards: bool = True,
    lengths: ReplyLengths | None = None,
    run_id: str = "",
    redo: Mapping[str, set[str]] | None = None,
) -> dict[str, ShardReport]:
    """Regenerate the assistant replies of every prompt in `shards` (partition key -> prompts frame).

    `shards` may read each frame only when it is looked up: the runner looks a shard up when it gets
    to it and lets go of it once the shard is written. Writes each finished shard to `store` as a
    generations frame, reuses rows and turns a previous run made durable under the same resume key,
    and returns one report per partition; every answered row's reply length is added to `lengths`.
    With `write_shards` False (a sample of a shard's prompts) the rows stay in the result log only,
    so no partial shard file ever looks finished. `run_id` names this run in shard leases (a random
    id when empty). Raises LeaseHeld / LeaseLost, after writing every other shard, when another run
    kept or took a shard, and FatalError (the server's line) after a fatal answer stopped the sending.
    `redo` (partition key -> prompt_ids) names stored rows to request again instead of reusing them.
    Closes the engine's loop-bound resources (`engine.aclose()`) at the end; engines reopen them lazily.
    """
    with _fewer_gc_passes():
        run = _Run(
            engine,
            spec,
            shards,
            store,
            settings or RunnerSettings(),
            log,
            write_shards,
            ReplyLengths() if lengths is None else lengths,
            run_id,
            redo or {},
        )
        return asyncio.run(run.main())
