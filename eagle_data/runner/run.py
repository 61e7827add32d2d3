"""`run_generation`: one event loop, one adaptive in-flight limit, every shard of a call.

A single producer walks the partitions in order. For each it takes the shard's lease (one writer per
shard; a shard another live run holds is deferred and waited for at the end), reads the prompts only
then (a range over 1,800 partitions holds just the shards in flight), and replays what the result log
already holds. Each remaining prompt (`conversation.py`) is admitted in one place (`admission.py`: in-flight
limit, budget, the breaker), sent with retries by the dispatcher (`dispatch.py`), and walks its user turns;
every answered turn goes to the shard writer (`writer.py`: durable within `flush_every_s`); a finished shard is
written whole, its lease released and its rows dropped from memory. `reporter.py` says how it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import polars as pl

from eagle_data import provenance
from eagle_data.catalog import DatasetSpec
from eagle_data.quality.truncation import ReplyLengths
from eagle_data.runner import mixture
from eagle_data.runner.breaker import BreakerTripped
from eagle_data.runner.conversation import Conversation
from eagle_data.runner.dispatch import Dispatcher
from eagle_data.runner.lease import Holder, LeaseLost
from eagle_data.runner.progress import ShardFigures, Tally
from eagle_data.runner.reporter import Reporter
from eagle_data.runner.resultlog import replayable, resume_key, reusable, stored_usage, turn_record
from eagle_data.runner.rows import Row, plan_turns
from eagle_data.runner.settings import RunnerSettings
from eagle_data.runner.writer import Finish, OpenShard, ShardWriter
from eagle_data.storage import ShardStore, StorageError
from eagle_data.types import Engine, SamplingRefused, UserError

GC_GEN0_THRESHOLD = 50_000  # see _fewer_gc_passes
LEASE_POLL_S = 1.0  # how often a deferred shard's lease is tried again


class LeaseHeld(UserError, RuntimeError):
    """Shards another live run kept generating for longer than this run would wait."""


class NothingAnswered(UserError, RuntimeError):
    """Requests were sent, every one failed, and no row of the call holds an answer (reused ones included):
    a step with no answer is never green. A re-run whose only request fails again, beside rows answered
    before, writes its shards and goes on: the failed rows are validation's `failed_rate` to judge."""


@dataclass
class ShardReport:
    """What one partition ended with; `figures.to_metadata()` is its Dagster metadata."""

    partition: str
    uri: str
    figures: ShardFigures


def _held_line(dataset: str, wait_s: float, held: dict[str, Holder]) -> str:
    now = time.time()
    return (
        f"{dataset}: {len(held)} shard(s) still held by another run after waiting lease_wait_s={wait_s:g} s: "
        + "; ".join(f"{p} by {h.describe(now)}" for p, h in sorted(held.items()))
        + "; every other shard is written: re-run once that run ends"
    )


class _Run:
    def __init__(
        self, engine: Engine, spec: DatasetSpec, shards: Mapping[str, pl.DataFrame], store: ShardStore,
        settings: RunnerSettings, log: Callable[[str], None], finish: Finish, lengths: ReplyLengths, run_id: str,
        redo: Mapping[str, set[str]],
    ) -> None:  # fmt: skip
        self.engine, self.spec, self.frames, self.store, self.settings, self.say = (
            engine, spec, shards, store, settings, log,
        )  # fmt: skip
        self.lengths, self.redo = lengths, redo
        self.key = resume_key(engine.config(), spec)
        self.sampling = provenance.sampling(engine.config())
        if spec.generation.mixture and not engine.takes_sampling:
            raise SamplingRefused(engine.name, spec.name)
        # Exact once a shard is read; until then a lazily read shard counts as a full one.
        known = {p: f.height for p, f in shards.items()} if isinstance(shards, dict) else {}
        self.expected = {p: known.get(p, spec.shard_size) for p in shards}
        self.total = Tally(total=sum(self.expected.values()))
        self.writer = ShardWriter(store, spec, run_id or uuid.uuid4().hex, settings, finish, log, self._stop)
        self.dispatch = Dispatcher(engine, spec, settings, self.key.max_tokens, self.total, log)
        self.admission = self.dispatch.admission
        self.reporter = Reporter(spec.name, settings, self.total, self.dispatch, engine, log)
        self.lease_lost = ""
        self.checked = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.finalizers: list[asyncio.Task[None]] = []
        self.reports: dict[str, ShardReport] = {}

    # ---- the call ---------------------------------------------------------------------------------
    async def main(self) -> dict[str, ShardReport]:
        tokens, usd = await asyncio.to_thread(stored_usage, self.store, self.spec.name)
        self.admission.budget.spend(tokens, usd)
        self.say(
            f"{self.spec.name}: {len(self.frames)} shards, about {self.total.total} prompts "
            f"(config {self.key.config_hash}), engine {self.engine.name} model {self.engine.model}"
        )
        loops = [
            asyncio.create_task(self.writer.flush_loop()),
            asyncio.create_task(self.writer.lease_loop(self._lease_lost)),
            asyncio.create_task(self.reporter.heartbeat_loop(lambda: bool(self.tasks))),
        ]
        try:
            held = await self._produce()
            while self.tasks:
                await asyncio.gather(*self.tasks)
            await asyncio.gather(*self.finalizers)
        finally:
            for task in loops:
                task.cancel()
            self.reporter.close()
            self.writer.abandon()  # blocking on purpose: it must run even when the loop is being cancelled
            await self.engine.aclose()
        self.total.ended = time.monotonic()
        self.say(self.reporter.line())
        self._raise_failure(held)
        return {p: self.reports[p] for p in self.frames}

    def _raise_failure(self, held: dict[str, Holder]) -> None:
        """After every shard is written: the one line that says why the call failed, if it did."""
        d, a = self.dispatch, self.admission
        if a.stop_reason:
            self.say(a.stop_reason)
        if d.fatal is not None:
            raise d.fatal.restated(a.stop_reason)  # its class: an AbortError or a ConfigError stays one
        if a.breaker.tripped:
            raise BreakerTripped(a.breaker.tripped)
        if unwritable := self.writer.unwritable_line():
            raise StorageError(unwritable)
        if self.lease_lost:
            raise LeaseLost(self.lease_lost)
        if held:
            raise LeaseHeld(_held_line(self.spec.name, self.settings.lease_wait_s, held))
        if self.total.requests and not (d.usable or self.total.ok or self.total.truncated):
            kinds = ", ".join(f"{k} x{n}" for k, n in self.total.errors.most_common(3))
            raise NothingAnswered(
                f"{self.spec.name}: every request failed, no usable reply ({self.total.failed} prompts "
                f"failed; {kinds}); check the server ({self.engine.describe()}) and re-run: failed rows are "
                "requested again"
            )

    def _lease_lost(self, message: str) -> None:
        self.lease_lost = message
        self._stop(message)

    def _stop(self, message: str) -> None:
        if not self.admission.stop_reason:
            self.admission.stop(message, "failed")

    async def _produce(self) -> dict[str, Holder]:
        """Every shard in order; those under another live run's lease at the end, waiting up to
        lease_wait_s for them. Returns the shards still held by others."""
        deferred: dict[str, Holder] = {}
        for partition in self.frames:
            if (holder := await asyncio.to_thread(self.writer.take, partition)) is not None:
                self.say(f"{self.spec.name} {partition}: held by {holder.describe(time.time())}; coming back to it")
                deferred[partition] = holder
                continue
            await self._produce_shard(partition)
        deadline, said = time.monotonic() + self.settings.lease_wait_s, time.monotonic()
        while deferred and time.monotonic() < deadline:
            await asyncio.sleep(LEASE_POLL_S)
            for partition in list(deferred):
                if (holder := await asyncio.to_thread(self.writer.take, partition)) is None:
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
        shard, todo, height = await asyncio.to_thread(self._open, partition)
        self.writer.opened(shard)
        self.total.total += height - self.expected[partition]
        for row in shard.rows.values():
            for tally in (shard.tally, self.total):
                tally.add(row, reused=True)
        if todo and not self.checked and not self.admission.stop_reason:
            self.checked = True
            self.say(await self.engine.check())
        loop = asyncio.get_running_loop()
        for conversation in todo:
            first = (
                conversation.messages + conversation.segments[len(conversation.replies)]
                if conversation.segments
                else None
            )
            admitted, conversation.held = await self.admission.admit(first)
            if not admitted:
                self._finish(shard, self.dispatch.stopped_row(conversation.prompt_id), conversation)
                continue
            task = loop.create_task(self._prompt(shard, conversation))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        self._maybe_finalize(shard)

    def _open(self, partition: str) -> tuple[OpenShard, list[Conversation], int]:
        """Read the shard's prompts and what its result log holds (blocking; the lease is ours); returns
        the shard, its conversations to generate and its number of prompts."""
        prompts = self.frames[partition]
        log = self.writer.log(partition)
        ids, redo = prompts["prompt_id"], self.redo.get(partition, set())
        keep = ids.filter(~ids.is_in(list(redo)))
        stored = reusable(log.load(), self.key).filter(pl.col("prompt_id").is_in(keep.implode()))
        shard = OpenShard(partition, log, ids.to_list(), {r["prompt_id"]: r for r in stored.iter_rows(named=True)})
        turns = {p: chain for p, chain in replayable(log.load_turns(), self.key).items() if p not in redo}
        todo = []
        for prompt in prompts.select("prompt_id", "messages").iter_rows(named=True):
            if prompt["prompt_id"] in shard.rows:
                continue
            conversation = Conversation(
                prompt["prompt_id"], plan_turns(prompt["messages"], self.spec.regenerate, self.spec.max_turns)
            )
            conversation.replay(turns.get(conversation.prompt_id, []))
            if conversation.ended:  # every turn was stored: the row is rebuilt, nothing is sent
                row = conversation.row("ok", "", finished_at=conversation.turns[-1]["finished_at"])
                shard.rows[conversation.prompt_id] = self._stamp(row)
                shard.reused.add(conversation.prompt_id)
            else:
                todo.append(conversation)
        shard.open = len(todo)
        return shard, todo, prompts.height

    # ---- one prompt -------------------------------------------------------------------------------
    async def _prompt(self, shard: OpenShard, conversation: Conversation) -> None:
        try:
            row = await self._generate(shard, conversation)
        finally:
            self.admission.leave(conversation.held)
            conversation.held = None
        self._finish(shard, row, conversation)

    async def _generate(self, shard: OpenShard, conversation: Conversation) -> Row:
        if not conversation.segments:
            return conversation.row("failed", "bad_prompt: no user turn to answer")
        while not conversation.ended:
            # After a budget stop a conversation under way goes on while each turn's worst case fits (a later
            # turn is held too; one that cannot fit ends it skipped_budget, its paid turns carried). Others end it.
            if conversation.replies and self.admission.stopped_hard:
                return conversation.row(self.admission.stop_status, self.admission.stop_reason)
            index, started = len(conversation.replies), time.monotonic()
            asked = conversation.messages + conversation.segments[index]
            held, conversation.held = conversation.held, None
            if held is None:
                fits, held = await self.admission.reserve(asked)
                if not fits:
                    return conversation.row("skipped_budget", self.admission.stop_reason)
            done, tries, error = await self.dispatch.complete(shard.tally, asked, conversation.prompt_id, held)
            if done is None:
                conversation.messages, conversation.attempts = asked, conversation.attempts + tries
                return conversation.row("failed", error)
            turn = turn_record(conversation.prompt_id, index, self.key, done, tries, time.monotonic() - started)
            conversation.add(done, turn)
            self.writer.add(shard, turn)
        return conversation.row("ok", "")

    # ---- results ----------------------------------------------------------------------------------
    def _stamp(self, row: Row) -> Row:
        g = self.spec.generation
        row.update(
            dataset=self.spec.name,
            config_hash=self.key.config_hash,
            base_hash=self.key.base_hash,
            max_tokens=self.key.max_tokens,
            engine=self.engine.name,
            model=self.engine.model,
            sampling=self.sampling,
            sampling_setting=getattr(mixture.assign(row["prompt_id"], g.mixture, g.mixture_seed), "name", ""),
        )
        return row

    def _finish(self, shard: OpenShard, row: Row, conversation: Conversation) -> None:
        shard.rows[row["prompt_id"]] = self._stamp(row)
        if row["status"] not in ("ok", "truncated"):
            shard.carry.extend(conversation.turns)  # paid turns of an unfinished conversation stay
        shard.open -= 1
        shard.tally.add(row)
        self.total.add(row)
        self.reporter.finished_one(row["status"])
        self._maybe_finalize(shard)

    def _maybe_finalize(self, shard: OpenShard) -> None:
        if shard.open == 0 and not shard.finalizing:
            shard.finalizing = True
            self.finalizers.append(asyncio.create_task(self._finalize(shard)))

    async def _finalize(self, shard: OpenShard) -> None:
        uri = await self.writer.write(shard)
        for row in shard.rows.values():
            if row["status"] in ("ok", "truncated"):
                self.lengths.add(row["completion_tokens"], row["finish_reason"])
        shard.rows, shard.carry = {}, []
        shard.tally.ended = time.monotonic()
        run = {"config_hash": self.key.config_hash, **self.dispatch.figures()}
        self.reports[shard.partition] = ShardReport(
            shard.partition, uri, shard.tally.figures(self.admission.limiter.current, run)
        )
        t = shard.tally
        self.say(
            f"{self.spec.name} {shard.partition}: {t.ok} ok, {t.truncated} truncated, {t.failed} failed, "
            f"{t.skipped_budget} skipped_budget ({t.reused} reused) -> {uri}"
        )


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
    hand_over: bool = False,
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
    so no partial shard file ever looks finished; with `hand_over` a finished shard's rows wait in the result
    log (`ResultLog.handed`) for the caller to write its file. `run_id` names this run in shard leases (a random
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
            ("hand_over" if hand_over else "shard") if write_shards else "sample",
            ReplyLengths() if lengths is None else lengths,
            run_id,
            redo or {},
        )
        return asyncio.run(run.main())
