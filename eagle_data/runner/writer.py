"""The shard writer: one writer per shard (its lease), answered turns durable within `flush_every_s`
(the shard's result log), and each finished shard written whole, its lease released."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Literal

from eagle_data.catalog import DatasetSpec
from eagle_data.runner.lease import LEASE_CHECKS, RENEWS_PER_TTL, Holder, LeaseLost, Leases, lease_ttl
from eagle_data.runner.progress import Tally
from eagle_data.runner.resultlog import ResultLog, Turn
from eagle_data.runner.rows import Row
from eagle_data.runner.settings import RunnerSettings
from eagle_data.storage import ROOT_ENV, ShardStore, StorageError, UnwritableRoot

Finish = Literal["shard", "hand_over", "sample"]  # a finished shard's rows: its file, a HANDED part, or parts


class OpenShard:
    """One partition while it is open; its rows are dropped once it is written."""

    def __init__(self, partition: str, log: ResultLog, order: list[str], rows: dict[str, Row]) -> None:
        self.partition, self.log, self.order = partition, log, order
        self.rows = rows
        self.reused = set(rows)
        self.open = 0  # prompts not finished yet
        self.pending: list[Turn] = []  # answered turns not yet durable
        self.carry: list[Turn] = []  # turns of conversations that ended unfinished: kept for the next run
        self.tally = Tally(total=len(order))
        self.lock = asyncio.Lock()
        self.finalizing = False


class ShardWriter:
    def __init__(
        self, store: ShardStore, spec: DatasetSpec, run_id: str, settings: RunnerSettings, finish: Finish,
        say: Callable[[str], None], stop: Callable[[str], None],
    ) -> None:  # fmt: skip
        """`stop`: stop sending new requests, with the line that says why (an unwritable output root)."""
        self.store, self.spec, self.run_id, self.settings, self.finish, self.say, self.stop = (
            store, spec, run_id, settings, finish, say, stop,
        )  # fmt: skip
        self.ttl_s = lease_ttl(settings.lease_ttl_s, store)  # outlives the storage retry window
        self.leases = Leases(store, spec.name, run_id, self.ttl_s)
        self.open_shards: dict[str, OpenShard] = {}
        self.flush_now = asyncio.Event()
        self.unwritable: UnwritableRoot | None = None  # the output root refused a write: full, quota, read-only
        self.unwritable_since = 0.0
        self.unstored = 0  # answered turns that could not be made durable: asked again by the next run

    def take(self, partition: str) -> Holder | None:
        """Take the shard's lease (blocking); the live run holding it, or None when it is ours."""
        return self.leases.take(partition)

    def log(self, partition: str) -> ResultLog:
        return ResultLog(self.store, self.spec.name, partition, self.run_id)

    def opened(self, shard: OpenShard) -> None:
        self.open_shards[shard.partition] = shard

    def add(self, shard: OpenShard, turn: Turn) -> None:
        """An answered turn: durable within flush_every_s, sooner when flush_every_rows wait."""
        shard.pending.append(turn)
        if len(shard.pending) >= self.settings.flush_every_rows:
            self.flush_now.set()

    async def write(self, shard: OpenShard) -> str:
        """Write a finished shard whole (a sample's rows only to its result log) and release its lease;
        its URI, "" when the lease is no longer this run's (its answered turns still go to the result log)."""
        async with shard.lock:
            waited = self.unwritable is not None or not self.leases.holds(shard.partition)
            if waited:
                await self._flush_until_stored(shard)  # bounded while the root refuses writes
            uri = ""
            if waited and (shard.pending or not self.leases.holds(shard.partition)):  # or another run writes it
                self.unstored += len(shard.pending)
            else:
                try:
                    uri = await asyncio.to_thread(self._finalize, shard)
                except UnwritableRoot as exc:  # the turns go to the result log instead: the next run replays them
                    self._refused(exc, shard)
                    await self._flush_until_stored(shard)
                    self.unstored += len(shard.pending)
            shard.pending = []
            with contextlib.suppress(UnwritableRoot):
                await asyncio.to_thread(self.leases.release, shard.partition)
        del self.open_shards[shard.partition]
        return uri

    def _finalize(self, shard: OpenShard) -> str:
        if self.finish != "sample":
            rows = [shard.rows[p] for p in shard.order]
            return shard.log.finalize(rows, shard.carry, whole=True, hand_over=self.finish == "hand_over")
        # a sample: rows stay in the result log, where the full run reuses them
        rows = [r for p, r in shard.rows.items() if p not in shard.reused and r["status"] != "skipped_budget"]
        return shard.log.finalize(rows, shard.carry, whole=False)

    async def flush_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush_now.wait(), self.settings.flush_every_s)
            self.flush_now.clear()
            for shard in list(self.open_shards.values()):
                if shard.pending and not shard.finalizing:
                    async with shard.lock:
                        await self._flush(shard)

    async def _flush_until_stored(self, shard: OpenShard) -> None:
        """Make the pending turns durable, waiting out a storage outage: they are paid for, and the run that
        takes the shard over replays them instead of paying again."""
        while shard.pending:
            await self._flush(shard)
            if shard.pending:
                if self.unwritable and time.monotonic() - self.unwritable_since > self.ttl_s:
                    return  # the root still refuses writes: the caller counts what stays unstored
                await asyncio.sleep(self.settings.flush_every_s)

    async def _flush(self, shard: OpenShard) -> None:
        turns, shard.pending = shard.pending, []
        try:
            await asyncio.to_thread(shard.log.append_turns, turns)
        except UnwritableRoot as exc:  # no outage to wait out: stop sending, keep retrying for a bounded time
            shard.pending = turns + shard.pending
            self._refused(exc, shard)
        except Exception as exc:  # storage trouble must not kill the run: keep the turns, retry next tick
            shard.pending = turns + shard.pending
            self.say(f"{self.spec.name} {shard.partition}: checkpoint failed, retrying: {exc!r}")

    def _refused(self, exc: UnwritableRoot, shard: OpenShard) -> None:
        """The first refusal stops the sending, saying how many answered turns wait in memory."""
        if self.unwritable is not None:
            return
        self.unwritable, self.unwritable_since = exc, time.monotonic()
        held = sum(len(s.pending) for s in self.open_shards.values())
        line = (
            f"{self.spec.name} {shard.partition}: the output root {exc.root} {exc.why}: stopped sending; {held} "
            f"answered turns are held in memory, their checkpoint retried for up to {self.ttl_s:g} s: "
            "free space now and nothing already answered is paid again"
        )
        self.say(f"WARNING {line}")
        self.stop(line)

    def unwritable_line(self) -> str:
        """The run's one-line error after the output root refused writes, "" when it never did."""
        if (exc := self.unwritable) is None:
            return ""
        kept = (
            f"{self.unstored} answered turns could not be written and will be asked again"
            if self.unstored
            else "every answered turn reached the result log, so nothing already answered is paid again"
        )
        return (
            f"{self.spec.name}: the output root {exc.root} {exc.why}: stopped sending at once; {kept}: free "
            f"space (or point {ROOT_ENV} at another folder) and re-run"
        )

    async def lease_loop(self, lost: Callable[[str], None]) -> None:
        """Keep the held leases: renewals in the background, and every LEASE_CHECKS-th of a ttl a look at
        whether one went unrenewed so long it must be given up; `lost` hears of a lease taken over by another
        run or given up (this run stops sending)."""
        renewing = asyncio.create_task(self._renew_loop(lost))
        try:
            while True:
                await asyncio.sleep(self.ttl_s / LEASE_CHECKS)
                if given_up := self.leases.give_up_unrenewed():
                    lost(given_up)
        finally:
            renewing.cancel()

    async def _renew_loop(self, lost: Callable[[str], None]) -> None:
        """Renew every ttl/3; a renewal that failed on storage is tried again after a LEASE_CHECKS-th of it."""
        pause = self.ttl_s / RENEWS_PER_TTL
        while True:
            await asyncio.sleep(pause)
            try:
                await asyncio.to_thread(self.leases.renew)
                pause = self.ttl_s / RENEWS_PER_TTL
            except LeaseLost as exc:
                lost(str(exc))
            except (StorageError, OSError) as exc:  # storage gone past its retry window: try again soon
                self.leases.last_error = str(exc)
                self.say(f"WARNING {self.spec.name}: lease renewal failed, retrying: {exc}")
                pause = self.ttl_s / LEASE_CHECKS

    def abandon(self) -> None:
        """Interrupted (Ctrl-C, Dagster termination) or done: keep what landed, free the leases."""
        for shard in self.open_shards.values():
            if shard.pending:  # paid for, whoever holds the shard now
                try:
                    shard.log.append_turns(shard.pending)
                except UnwritableRoot as exc:
                    self._refused(exc, shard)
                    self.unstored += len(shard.pending)
                shard.pending = []
        for partition in list(self.leases.held):
            with contextlib.suppress(UnwritableRoot):
                self.leases.release(partition)
