"""Runner settings: one frozen dataclass, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass

RAMP_START = 32  # where a ramping engine's in-flight limit starts: never a cold-start 429 storm
RAMP_FLOOR = 4


@dataclass(frozen=True)
class RunnerSettings:
    """How hard and how carefully the runner drives an engine.

    Attributes:
        max_in_flight: ceiling of concurrent requests across every shard of a call.
        initial_in_flight: where the adaptive limit starts; low, so a cold start never causes a 429
            storm. Set equal to `max_in_flight` for engines we own (local, SGLang).
        min_in_flight: floor the limit never backs off below.
        max_attempts: attempts per request for ordinary retryable errors (5xx, timeouts, resets).
        max_throttle_waits: extra attempts allowed for throttling (429/503/402 in-flight budget),
            which do not use up `max_attempts`: "429 is always retried", but not forever.
        backoff_base_s / backoff_cap_s: jittered exponential backoff between attempts.
        flush_every_s: answered turns become durable (appended and fsync'd, or a part object on S3)
            at least this often: a SIGKILL repays at most this many seconds of answers.
        flush_every_rows: ... or as soon as this many turns wait.
        progress_every: a progress log line every N finished prompts.
        progress_bar: draw a terminal bar on stderr when it is a TTY.
        heartbeat_every_s: while prompts are open, a sign-of-life line at least this often (in flight,
            the oldest request's age, done, errors so far), so a hung server is visible within seconds.
        max_retry_wait_s: the longest a server's Retry-After is honoured; a long one is announced.
        lease_ttl_s: a shard's lease expires this long after its last renewal (renewed every third of
            it): how long a run that died on another host keeps others off its shards. On S3 a run uses
            more where the storage retry window needs it (`runner.lease.lease_ttl`: 375 s for 120 s).
        lease_wait_s: how long to wait, after every other shard, for shards another live run holds;
            then the call fails naming them (their rows are that run's to write).
    """

    max_in_flight: int = 2000
    initial_in_flight: int = 32
    min_in_flight: int = 4
    max_attempts: int = 6
    max_throttle_waits: int = 50
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    flush_every_s: float = 0.5
    flush_every_rows: int = 5000
    progress_every: int = 500
    progress_bar: bool = True
    heartbeat_every_s: float = 30.0
    max_retry_wait_s: float = 600.0
    lease_ttl_s: float = 60.0
    lease_wait_s: float = 3600.0

    @classmethod
    def in_flight(cls, max_in_flight: int, *, ramp: bool) -> RunnerSettings:
        """Defaults for an engine this wide: a ramping one (a paid API) starts at RAMP_START, one we own at
        full width (the engine kind's `max_in_flight` and `ramp`)."""
        start = min(RAMP_START, max_in_flight) if ramp else max_in_flight
        return cls(max_in_flight=max_in_flight, initial_in_flight=start, min_in_flight=min(RAMP_FLOOR, start))

    def __post_init__(self) -> None:
        if self.min_in_flight < 1:
            raise ValueError(f"runner settings: min_in_flight {self.min_in_flight} is below 1: set min_in_flight >= 1")
        if self.initial_in_flight < self.min_in_flight:
            raise ValueError(
                f"runner settings: initial_in_flight {self.initial_in_flight} is below min_in_flight "
                f"{self.min_in_flight}: raise initial_in_flight or set min_in_flight <= {self.initial_in_flight}"
            )
        if self.max_in_flight < self.initial_in_flight:
            raise ValueError(
                f"runner settings: max_in_flight {self.max_in_flight} is below initial_in_flight "
                f"{self.initial_in_flight}: raise max_in_flight or set initial_in_flight <= {self.max_in_flight}"
            )
        if self.max_attempts < 1 or self.max_throttle_waits < 0:
            raise ValueError("runner settings: max_attempts must be >= 1 and max_throttle_waits >= 0")
        if self.backoff_base_s < 0 or self.backoff_cap_s < self.backoff_base_s:
            raise ValueError("runner settings: need 0 <= backoff_base_s <= backoff_cap_s")
        if self.flush_every_s <= 0 or self.flush_every_rows < 1 or self.progress_every < 1:
            raise ValueError("runner settings: flush_every_s, flush_every_rows and progress_every must be > 0")
        if self.max_retry_wait_s < 0:
            raise ValueError("runner settings: max_retry_wait_s must be >= 0")
        if self.heartbeat_every_s <= 0 or self.lease_ttl_s <= 0 or self.lease_wait_s < 0:
            raise ValueError("runner settings: heartbeat_every_s and lease_ttl_s must be > 0, lease_wait_s >= 0")
