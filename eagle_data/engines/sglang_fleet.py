"""A pool of SGLang servers: probe, least-loaded dispatch under a per-server cap, mark-down and re-probe.

Kept apart from the request/response code in `sglang.py`: this module knows servers, not prompts.
One URL may be an sglang-router in front of many servers: it is one server here, with its own cap
(by default sized by its healthy workers; `sglang_probe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from eagle_data.engines.sglang_probe import probe
from eagle_data.secrets import mask_url
from eagle_data.types import FatalError, RetryableError

log = logging.getLogger(__name__)


class ServerGoneError(Exception):
    """The server answered that it is going away (502/503/504)."""


# What a dead or dying server looks like from the client: refused, reset, cut off, timed out.
SERVER_GONE_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    asyncio.TimeoutError,
    ServerGoneError,
)


@dataclass
class Server:
    """One server's state and counters (the figures `stats()` reports)."""

    url: str
    cap: int
    up: bool = True
    running: int = 0
    requests: int = 0
    failures: int = 0  # times it was marked down
    resent: int = 0  # requests it failed that went to another server
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started_at: float = field(default_factory=time.monotonic)
    down_reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def shown(self) -> str:
        """The URL as logs and metadata show it (credentials masked)."""
        return mask_url(self.url)

    def record(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def stats(self, now: float) -> dict[str, Any]:
        elapsed = max(now - self.started_at, 1e-9)
        return {
            "url": self.shown,
            "up": self.up,
            "running": self.running,
            "requests": self.requests,
            "failures": self.failures,
            "resent": self.resent,
            "completion_tokens": self.completion_tokens,
            "tok_s": round(self.completion_tokens / elapsed, 1),
            "down_reason": self.down_reason,
        }


def fleet_stats(servers: list[Server]) -> dict[str, Any]:
    """Per-server and total figures for the progress line and Dagster metadata."""
    now = time.monotonic()
    per = [s.stats(now) for s in servers]
    return {
        "servers_up": sum(s.up for s in servers),
        "servers": len(servers),
        "running": sum(p["running"] for p in per),
        "requests": sum(p["requests"] for p in per),
        "completion_tokens": sum(p["completion_tokens"] for p in per),
        "tok_s": round(sum(p["tok_s"] for p in per), 1),
        "failovers": sum(p["resent"] for p in per),
        "per_server": per,
    }


def stats_line(stats: dict[str, Any]) -> str:
    """`fleet_stats` as one progress-line fragment, with the same names as the metadata."""
    per = " ".join(f"{p['tok_s']:.0f}" if p["up"] else "down" for p in stats["per_server"])
    return (
        f"servers_up {stats['servers_up']}/{stats['servers']} running {stats['running']} "
        f"tok_s {stats['tok_s']:.0f} [{per}] failovers {stats['failovers']}"
    )


class Fleet:
    """The loop-bound side of a server list: `lease()` hands out the least-loaded server that is up and
    under its cap; `mark_down()` takes one out and re-probes it. The Server objects (counters) outlive
    it, so figures add up across event loops (one `asyncio.run` per `run_generation` call)."""

    def __init__(
        self,
        servers: list[Server],
        *,
        model: str,
        cap: int | None,
        session: aiohttp.ClientSession,
        probe_timeout_s: float,
        reprobe_s: float,
    ) -> None:
        self.model, self.session, self.servers = model, session, servers
        self.probe_timeout_s, self.reprobe_s = probe_timeout_s, reprobe_s
        self._cap = cap
        self._cond = asyncio.Condition()
        self._reprobes: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        """Probe every server; unreachable ones start down (and are re-probed), a wrong model is fatal."""
        for server in self.servers:
            server.up, server.running, server.down_reason = True, 0, ""
        results = await asyncio.gather(
            *(probe(self.session, s.url, self.model, self.probe_timeout_s) for s in self.servers),
            return_exceptions=True,
        )
        for server, result in zip(self.servers, results, strict=True):
            if isinstance(result, FatalError):  # configuration: wrong model, not SGLang, a router with no worker
                raise result
            if isinstance(result, BaseException):
                await self.mark_down(server, describe_error(result))
            else:
                self._set_info(server, result)
        if not any(s.up for s in self.servers):
            reasons = "; ".join(f"{s.shown}: {s.down_reason}" for s in self.servers)
            raise FatalError(
                f"no SGLang server is reachable ({reasons}): start them or fix the URLs", kind="server_down"
            )

    def _set_info(self, server: Server, info: dict[str, Any]) -> None:
        """Default cap: twice the server's --max-running-requests, so its queue never runs dry; for an
        sglang-router, which reports no worker's figure, twice SGLang's default per healthy worker."""
        server.info = info
        per_worker = 2 * int(info.get("max_running_requests") or 64)
        server.cap = self._cap or per_worker * int(info.get("workers") or 1)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Server]:
        """Wait for a server with room; count the request as running on it until the block exits."""
        async with self._cond:
            while True:
                up = [s for s in self.servers if s.up]
                if not up:
                    reasons = "; ".join(f"{s.shown}: {s.down_reason}" for s in self.servers)
                    raise RetryableError(f"every SGLang server is down ({reasons})", kind="server_down")
                free = [s for s in up if s.running < s.cap]
                if free:
                    server = min(free, key=lambda s: (s.running / s.cap, s.requests))
                    server.running += 1
                    break
                await self._cond.wait()
        try:
            yield server
        finally:
            server.running -= 1
            async with self._cond:
                self._cond.notify()

    async def mark_down(self, server: Server, reason: str) -> None:
        """Stop sending to `server` and re-probe it every `reprobe_s` until it answers again."""
        if server.up:
            log.warning("SGLang server %s is down (%s); re-probing every %gs", server.shown, reason, self.reprobe_s)
        server.up, server.down_reason = False, reason
        server.failures += 1
        if server.url not in self._reprobes or self._reprobes[server.url].done():
            self._reprobes[server.url] = asyncio.create_task(self._reprobe(server))
        await self._wake_all()  # waiters re-check: they may have to give up

    async def _wake_all(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def _reprobe(self, server: Server) -> None:
        while not server.up:
            await asyncio.sleep(self.reprobe_s)
            try:
                info = await probe(self.session, server.url, self.model, self.probe_timeout_s)
            except (*SERVER_GONE_ERRORS, aiohttp.ClientError, RetryableError, FatalError) as exc:
                server.down_reason = describe_error(exc)
                continue
            self._set_info(server, info)
            server.up, server.down_reason = True, ""
            log.warning("SGLang server %s is back", server.shown)
            await self._wake_all()

    async def aclose(self) -> None:
        for task in self._reprobes.values():
            task.cancel()
        await asyncio.gather(*self._reprobes.values(), return_exceptions=True)
        self._reprobes.clear()


def describe_error(exc: BaseException) -> str:
    """One short line for logs and stats."""
    return f"{type(exc).__name__}: {exc}"[:200] if str(exc) else type(exc).__name__
