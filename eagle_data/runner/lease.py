"""One writer per shard: a lease object in storage, taken atomically, renewed while generating.

Two runs on one output root (two Dagster instances, a CLI run beside a backfill) must never both
generate a shard: each would pay for every turn. Before a run opens a shard it takes the shard's lease:

- Key: `layout.lease` (`{ds}/{ds}/_lease/{partition}/{generation:08d}.json`); the highest generation
  is the lease. Its JSON names the owner (run id, host, pid) and carries a heartbeat and an expiry.
- Take: read the highest generation. Live and someone else's: refuse, saying which run holds it.
  Otherwise create the next generation with `ShardStore.create_exclusive` (link(2), which fails like
  O_EXCL on a folder; a PUT with `If-None-Match: *` on S3): of runs racing for a free or expired
  shard exactly one creates it. The winner deletes the generations below its own.
- Lifetime: `lease_ttl`, the runner's `lease_ttl_s` or longer on S3, where it is derived from the storage retry
  window (`EAGLE_DATA_STORAGE_RETRY_S`) so that it cannot expire inside an outage that window rides out.
- Renew: every `ttl_s / 3` the holder rewrites its generation with a fresh expiry. A higher generation
  means the lease expired and another run took it over (this one stalled for longer than ttl_s):
  `LeaseLost`, and the shard is not written by this run. A renewal that fails (storage unreachable for
  longer than its retry window) is tried again at once; a lease with less than `MARGIN` of its ttl left
  unrenewed is given up (`give_up_unrenewed`): the run stops sending before the lease can expire, keeps
  its answered turns for the result log and leaves the shard to whichever run takes it over after expiry.
- Release: the holder deletes its generation; the next run starts again at 0. (A holder that stalled
  past ttl_s and releases just as a second run takes over lets a third start at 0 beside the second;
  the lower of the two finds the higher at its next renewal and gives the shard up: LeaseLost.)
- Dead: expired, or owned by a process on this host that no longer exists: a SIGKILLed run's shards
  are taken over at once on the same machine, and after `ttl_s` from anywhere else.

S3 conditional writes (`If-None-Match: *` on PutObject) are AWS S3's since August 2024; moto's server
honours them (412 PreconditionFailed, tested in the suite), as do MinIO, R2 and GCS. A store that ignored
the header would let two racing runs both take a free shard.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle_data import layout
from eagle_data.storage import RETRY_ENV, ShardStore, retry_window_s
from eagle_data.storage.s3 import RETRY_PAUSE_S
from eagle_data.types import UserError

MARGIN = 0.25  # a lease is given up with this share of its ttl left unrenewed: time for in-flight replies
RENEWS_PER_TTL = 3  # the holder renews every third of the ttl
LEASE_CHECKS = 12  # looks per ttl for a lease left unrenewed too long; a failed renewal is tried again as often


class LeaseLost(UserError):
    """Another run took over a shard this run was generating, or this run could not renew its lease."""


@dataclass(frozen=True)
class Holder:
    """What a lease object says: who holds the shard and until when (wall-clock seconds)."""

    run_id: str
    host: str
    pid: int
    heartbeat: float
    expires: float
    generation: int = 0

    def alive(self, now: float) -> bool:
        if self.expires <= now:
            return False
        return not (self.host == socket.gethostname() and not _process_exists(self.pid))

    def describe(self, now: float) -> str:
        return f"run {self.run_id} (host {self.host}, pid {self.pid}, heartbeat {now - self.heartbeat:.0f} s ago)"


def lease_ttl(asked_s: float, store: ShardStore) -> float:
    """The lease lifetime a run uses on `store`: `asked_s`, or longer where the storage retry window W needs it
    (S3; a folder has none), so the lease cannot expire inside an outage the window rides out. A renewal starts
    at most ttl/3 after the last one landed and waits the outage out inside one retried call: it lands at most
    one pause p after storage is back, or, when that call gave up just before, a LEASE_CHECKS-th of the ttl
    later. It must land with MARGIN of the ttl left: ttl/3 + W + max(p, ttl/12) <= 3/4 ttl, which
    ttl >= 3 (W + p) meets (p: the longest pause, or W when shorter). W = 120 s gives 375 s."""
    return max(asked_s, _outlasting(retry_window_s() if store.is_s3 else 0.0))


def _outlasting(window_s: float) -> float:
    """The shortest ttl that outlives an outage of `window_s` (lease_ttl)."""
    return RENEWS_PER_TTL * (window_s + min(window_s, RETRY_PAUSE_S[1]))


class Leases:
    """The leases one run takes on the shards of one dataset."""

    def __init__(self, store: ShardStore, dataset: str, run_id: str, ttl_s: float) -> None:
        self.store, self.dataset, self.run_id, self.ttl_s = store, dataset, run_id, ttl_s
        self.window_s = retry_window_s() if store.is_s3 else 0.0  # how long one storage call rides out an outage
        self.held: dict[str, int] = {}  # partition -> generation this run holds
        self.expires: dict[str, float] = {}  # partition -> the expiry its last written lease object says
        self.renewed_at = time.time()  # when a renewal last went through
        self.last_error = ""  # why the latest renewal failed ("" once one succeeds)
        self._lock = threading.Lock()  # renewal (its own thread) never races a release

    def take(self, partition: str) -> Holder | None:
        """Take the shard's lease: None when this run now holds it, else the live holder (blocking)."""
        while True:
            top = self._top(partition)
            now = time.time()
            if top is not None and top.alive(now) and top.run_id != self.run_id:
                return top
            generation = top.generation + 1 if top is not None else 0
            if self.store.create_exclusive(self._key(partition, generation), self._body(generation, now)):
                self.held[partition], self.expires[partition] = generation, now + self.ttl_s
                for key in self._generations(partition):
                    if layout.lease_generation(key) < generation:
                        self.store.delete(key)
                return None

    def renew(self) -> None:
        """Push every held lease's expiry ahead; LeaseLost when another run took one over (blocking)."""
        for partition in list(self.held):
            with self._lock:
                generation = self.held.get(partition)
                if generation is None:  # released meanwhile
                    continue
                top = self._top(partition)
                if top is None or top.generation != generation or top.run_id != self.run_id:
                    del self.held[partition]
                    taker = top.describe(time.time()) if top is not None else "another run"
                    raise LeaseLost(
                        f"{self.dataset} {partition}: the shard's lease expired and {taker} took it over; this "
                        f"run stalled for more than lease_ttl_s={self.ttl_s:g} s and leaves the shard to it"
                    )
                now = time.time()
                if self.held.get(partition) == generation:  # not given up while the read waited
                    self.store.write_bytes(self._key(partition, generation), self._body(generation, now))
                    self.expires[partition] = now + self.ttl_s
        self.renewed_at, self.last_error = time.time(), ""

    def give_up_unrenewed(self) -> str:
        """Drop (without deleting) every held lease with less than MARGIN of its ttl left; the one line that
        says so, "" when none was. Never blocks: the run's loop calls it while a renewal may hang on storage."""
        now = time.time()
        late = [p for p in list(self.held) if self.expires.get(p, now) - now < self.ttl_s * MARGIN]
        for partition in late:
            self.held.pop(partition, None)
        if not late:
            return ""
        outlived = (
            f", which outlives any outage inside {RETRY_ENV}={self.window_s:g} s: storage was gone for longer"
            if self.window_s and self.ttl_s >= _outlasting(self.window_s)
            else ""
        )
        return (
            f"{self.dataset} {', '.join(late)}: the shard lease could not be renewed for {now - self.renewed_at:.0f} s "
            f"({self.last_error or 'renewal still waiting on storage'}); stopped sending before it could expire "
            f"(lease_ttl_s={self.ttl_s:g} s{outlived}), so no other run pays for these turns twice; the answered "
            "turns are kept in the result log: re-run once storage answers"
        )

    def holds(self, partition: str) -> bool:
        return partition in self.held

    def release(self, partition: str) -> None:
        """Drop the lease so the next run takes the shard at once (blocking)."""
        with self._lock:
            generation = self.held.pop(partition, None)
            if generation is not None:
                self.store.delete(self._key(partition, generation))

    # ---- objects ---------------------------------------------------------------------------------
    def _key(self, partition: str, generation: int) -> str:
        return layout.lease(self.dataset, partition, generation)

    def _generations(self, partition: str) -> list[str]:
        keys = self.store.list(layout.lease_prefix(self.dataset, partition))
        return [k for k in keys if (parsed := layout.parse(k)) is not None and parsed.kind == "lease"]

    def _body(self, generation: int, now: float) -> bytes:
        holder = Holder(self.run_id, socket.gethostname(), os.getpid(), now, now + self.ttl_s, generation)
        return json.dumps(asdict(holder)).encode()

    def _top(self, partition: str) -> Holder | None:
        """The highest generation, or None when the shard was never leased."""
        while True:
            keys = self._generations(partition)
            if not keys:
                return None
            key = max(keys, key=layout.lease_generation)
            try:
                return Holder(**json.loads(self.store.read_bytes(key)))
            except Exception as exc:  # taken over and deleted since the listing: look again
                if not self.store.missing(exc):
                    raise


def _process_exists(pid: int) -> bool:
    """Whether a process with this id runs here (a killed one its parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS): the signal check is all there is
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"
