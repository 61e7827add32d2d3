"""SGLang engine: exact output token ids from a data-parallel fleet of SGLang servers.

Two paths. `mode="generate"` (default) sends `input_ids` built with the target's chat template to
SGLang's native `/generate` and keeps `output_ids`: the training ids are the model's own tokens.
`mode="chat"` uses `/v1/chat/completions`, where the server applies the template and its
`--reasoning-parser` returns `reasoning_content`; no token ids come back.

Failover: a server that refuses, resets, times out or answers 502/503/504 is marked down (and
re-probed), and the same request goes to another server. Each `complete()` returns exactly one
Completion, so nothing is lost and nothing counted twice.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from eagle_data.engines import EngineKind, EngineSettings, register
from eagle_data.engines.openai_protocol import ABORT_STATUSES
from eagle_data.engines.replies import reply_text, split_ids
from eagle_data.engines.sglang_fleet import (
    SERVER_GONE_ERRORS,
    Fleet,
    Server,
    ServerGoneError,
    describe_error,
    fleet_stats,
    stats_line,
)
from eagle_data.secrets import mask_url
from eagle_data.targets import Target, load_target
from eagle_data.targets.derived import DerivedTarget
from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers, reasoning_markers
from eagle_data.types import (
    PROMPT_ID_HEADER,
    AbortError,
    Completion,
    Engine,
    FatalError,
    Message,
    RetryableError,
    Sampling,
    SamplingRefused,
)

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec

GONE_STATUSES = frozenset({502, 503, 504})  # the server (or the router's upstream) is going away


class SGLangSettings(BaseModel):
    """Where the servers are and what changes the output.

    Attributes:
        urls: server base URLs (one per data-parallel server), or one sglang-router URL.
        model: the target model; each server's /model_info (`served_model_name` or `model_path`), or
            every healthy worker a router lists, must name it.
        mode: "generate" (native, token ids) or "chat" (OpenAI-compatible, reasoning_content).
        thinking: the target's thinking switch (chat template `enable_thinking`).
        max_in_flight_per_server: requests sent to one server at once; None: twice its
            --max-running-requests (from /server_info), else 128; a router URL is one server whose
            default is 128 per healthy worker (set it to the whole fleet's figure).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    urls: tuple[str, ...] = Field(min_length=1)
    model: str = Field(min_length=1)
    mode: Literal["generate", "chat"] = "generate"
    thinking: bool = True
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # -1: off (SGLang's default)
    max_new_tokens: int = Field(4096, gt=0, validation_alias=AliasChoices("max_new_tokens", "max_tokens"))
    min_new_tokens: int = Field(0, ge=0, validation_alias=AliasChoices("min_new_tokens", "min_tokens"))
    stop_token_ids: tuple[int, ...] = ()
    max_in_flight_per_server: int | None = Field(None, gt=0)
    timeout_s: float = Field(3600.0, gt=0)  # whole-request timeout: a long thinking trace can take many minutes
    connect_timeout_s: float = Field(10.0, gt=0)  # a dead host fails fast
    probe_timeout_s: float = Field(10.0, gt=0)
    reprobe_s: float = Field(10.0, gt=0)


@dataclass(frozen=True)
class Codec:
    """The target's tokenization, needed by the native path.

    `prompt_ids(messages, thinking)` gives the generation prompt ids for a conversation (chat template
    applied, assistant header included); `decode(ids)` gives text with special tokens kept; `markers` are the
    target's think-block markers (None: its format has none).
    """

    prompt_ids: Callable[[list[Message], bool], list[int]]
    decode: Callable[[list[int]], str]
    markers: ReasoningMarkers | None = None


def codec_for(target: Target | DerivedTarget) -> Codec:
    """The Codec of a loaded target: its chat template, tokenizer and think-block markers."""
    return Codec(
        prompt_ids=lambda messages, thinking: target.prompt_ids(messages, thinking=thinking),
        decode=target.decode,
        markers=reasoning_markers(target.name),
    )


def normalize_finish(raw: Any) -> tuple[str, Any]:
    """SGLang's finish_reason ({"type": "length", "length": N} / {"type": "stop", "matched": id}
    / a plain OpenAI string) as ("stop" | "length" | "abort" | other, matched)."""
    if isinstance(raw, dict):
        return str(raw.get("type", "stop")), raw.get("matched")
    return (str(raw), None) if raw else ("stop", None)


class SGLangEngine(Engine):
    """eagle_data.types.Engine over one or more SGLang servers."""

    name = "sglang"

    def __init__(self, settings: SGLangSettings, codec: Codec | None = None) -> None:
        if settings.mode == "generate" and codec is None:
            raise ValueError("SGLang mode 'generate' needs the target's Codec (prompt ids and decode)")
        self.settings, self.codec, self.model = settings, codec, settings.model
        self.servers = [Server(url=u.rstrip("/"), cap=1) for u in settings.urls]  # counters outlive loops
        self._fleet: Fleet | None = None
        self._session: aiohttp.ClientSession | None = None
        self._start_lock = asyncio.Lock()

    def config(self) -> dict[str, Any]:
        """What changes the output: servers and caps do not, so they stay out of the resume key."""
        s = self.settings
        return {
            "engine": self.name,
            "model": s.model,
            "mode": s.mode,
            "thinking": s.thinking,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "max_new_tokens": s.max_new_tokens,
            "min_new_tokens": s.min_new_tokens,
            "stop_token_ids": list(s.stop_token_ids),
        }

    def stats(self) -> dict[str, Any]:
        """Per-server and total figures (tok/s, running, requests, failovers) for progress and metadata."""
        return fleet_stats(self.servers)

    def stats_line(self) -> str:
        return stats_line(self.stats())

    async def start(self) -> None:
        """Probe the servers (called by the first `complete()`; call it early to fail fast)."""
        async with self._start_lock:
            if self._fleet is not None:
                return
            s = self.settings
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            fleet = Fleet(
                self.servers,
                model=s.model,
                cap=s.max_in_flight_per_server,
                session=self._session,
                probe_timeout_s=s.probe_timeout_s,
                reprobe_s=s.reprobe_s,
            )
            try:
                await fleet.start()
            except BaseException:
                await fleet.aclose()
                await self._session.close()
                raise
            self._fleet = fleet

    async def check(self) -> str:
        await self.start()
        stats = self.stats()
        workers = sum(int(s.info.get("workers") or 0) for s in self.servers if s.up and s.info.get("router"))
        behind = f" ({workers} healthy workers behind sglang-router)" if workers else ""
        return f"SGLang: {stats['servers_up']}/{stats['servers']} servers up{behind}, serving {self.settings.model}"

    async def complete(
        self, messages: list[Message], *, prompt_id: str, sampling: Sampling | None = None
    ) -> Completion:
        if sampling is not None:
            raise SamplingRefused(self.name)
        await self.start()
        assert self._fleet is not None
        path, payload = self._request(messages, prompt_id)
        headers = {PROMPT_ID_HEADER: prompt_id}
        # Every failure marks a server down, so the loop ends: with a reply, or with no server left.
        for _ in range(2 * len(self._fleet.servers) + 1):
            async with self._fleet.lease() as server:
                try:
                    body = await self._post(server.url + path, payload, headers)
                except SERVER_GONE_ERRORS as exc:
                    server.resent += 1
                    await self._fleet.mark_down(server, describe_error(exc))
                    continue
                completion = self._parse(body)
                server.record(completion.prompt_tokens, completion.completion_tokens)
                return completion
        raise RetryableError(f"prompt {prompt_id}: SGLang servers keep failing", kind="server_down")

    async def aclose(self) -> None:
        """Close the session; a later `complete()` (in any event loop) starts afresh."""
        if self._fleet:
            await self._fleet.aclose()
        if self._session:
            await self._session.close()
        self._fleet, self._session, self._start_lock = None, None, asyncio.Lock()

    def _request(self, messages: list[Message], prompt_id: str) -> tuple[str, dict[str, Any]]:
        s = self.settings
        rid = f"{prompt_id}-{uuid.uuid4().hex[:8]}"
        if s.mode == "chat":
            return "/v1/chat/completions", {
                "model": s.model,
                "rid": rid,
                "messages": [{"role": m["role"], "content": m.get("content", "")} for m in messages],
                "max_tokens": s.max_new_tokens,
                "temperature": s.temperature,
                "top_p": s.top_p,
                "top_k": s.top_k,
                "min_tokens": s.min_new_tokens,
                "stop_token_ids": list(s.stop_token_ids) or None,
                "chat_template_kwargs": {"enable_thinking": s.thinking},
                "separate_reasoning": True,
            }
        assert self.codec is not None
        params: dict[str, Any] = {
            "max_new_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
        }
        if s.min_new_tokens:
            params["min_new_tokens"] = s.min_new_tokens
        if s.stop_token_ids:
            params["stop_token_ids"] = list(s.stop_token_ids)
        return "/generate", {
            "input_ids": self.codec.prompt_ids(messages, s.thinking),
            "sampling_params": params,
            "rid": rid,
        }

    async def _post(self, url: str, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """POST and sort failures: server gone (raised as-is for failover), retryable, fatal."""
        assert self._session is not None
        s = self.settings
        # `total` bounds the whole request, answer included: a server dripping bytes cannot stretch it.
        timeout = aiohttp.ClientTimeout(total=s.timeout_s, sock_connect=s.connect_timeout_s)
        shown = mask_url(url)
        async with self._session.post(url, json=payload, headers=headers, timeout=timeout) as resp:
            if resp.status in GONE_STATUSES:
                raise ServerGoneError(f"{shown} answered {resp.status}")
            text = await resp.text()
            if resp.status == 429 or resp.status >= 500:
                raise RetryableError(
                    f"{shown} answered {resp.status}: {text[:200]}",
                    kind=f"http_{resp.status}",
                    throttle=resp.status == 429,
                )
            if resp.status != 200:  # a refused key or an unknown route stops the run: every prompt would hit it
                raise (AbortError if resp.status in ABORT_STATUSES else FatalError)(
                    f"{shown} refused the request ({resp.status}): {text[:300]}", kind=f"http_{resp.status}"
                )
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise RetryableError(f"{shown} sent non-JSON: {text[:200]}", kind="bad_json") from exc
        if isinstance(body, dict) and body.get("error"):
            raise RetryableError(f"{shown} returned an error: {str(body['error'])[:300]}", kind="error_in_body")
        return body

    def _parse(self, body: dict[str, Any]) -> Completion:
        if self.settings.mode == "chat":
            return _parse_chat(body, self.codec.markers if self.codec else THINK_TAGS)
        assert self.codec is not None
        meta = body.get("meta_info", {})
        finish, matched = normalize_finish(meta.get("finish_reason"))
        if finish == "abort":
            raise RetryableError(f"SGLang aborted the request: {meta['finish_reason']}", kind="sglang_abort")
        ids = body.get("output_ids")
        if ids is None:
            raise FatalError("SGLang /generate returned no output_ids: use SGLang >= 0.5", kind="no_ids")
        ids = [int(i) for i in ids]
        text_ids = ids[:-1] if finish == "stop" and ids and ids[-1] == matched else ids
        # A reply cut off with no marker while thinking is on is reasoning: templates may open the block in the prompt.
        reasoning, content, reasoning_tokens = split_ids(
            text_ids,
            self.codec.markers,
            self.codec.decode,
            cut_while_thinking=self.settings.thinking and finish == "length",
        )
        return Completion(
            content=content,
            reasoning=reasoning,
            finish_reason=finish,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", len(ids))),
            reasoning_tokens=reasoning_tokens,
            provider="sglang",
            output_ids=ids,
        )


def _parse_chat(body: dict[str, Any], markers: ReasoningMarkers | None) -> Completion:
    if not body.get("choices"):
        raise RetryableError(f"SGLang chat reply without choices: {str(body)[:200]}", kind="bad_body")
    choice = body["choices"][0]
    message = choice.get("message") or {}
    finish, _ = normalize_finish(choice.get("finish_reason"))
    if finish == "abort":
        raise RetryableError("SGLang aborted the request", kind="sglang_abort")
    usage = body.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    reasoning, content = reply_text(message, markers)
    return Completion(
        content=content,
        reasoning=reasoning,
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        reasoning_tokens=int(details.get("reasoning_tokens") or 0),
        provider="sglang",
        served_model=body.get("model") or "",
    )


def _build(settings: EngineSettings, spec: DatasetSpec) -> SGLangEngine:
    g = spec.generation
    urls = tuple(url.strip() for url in settings.base_url.split(",") if url.strip())
    return SGLangEngine(
        SGLangSettings(urls=urls, model=settings.model, thinking=g.thinking, temperature=g.temperature, top_p=g.top_p,
                       max_new_tokens=g.max_tokens, min_new_tokens=g.min_tokens, **settings.timeouts()),
        codec_for(load_target(spec.target)),
    )  # fmt: skip


def make_sglang(*, codec: Codec | None = None, **settings: Any) -> SGLangEngine:
    """From SGLangSettings fields; `codec`: the target's Codec (needed by mode "generate")."""
    return SGLangEngine(SGLangSettings(**settings), codec)


register(EngineKind(
    name="sglang", build=_build, make=make_sglang, summary="a fleet of SGLang servers (native /generate, token ids)",
    required={"model": "set EAGLE_DATA_MODEL (e.g. Qwen/Qwen3-8B)", "base_url": "set EAGLE_DATA_BASE_URL to "
              "comma-separated http://host:port URLs (or one sglang-router URL)"},
    max_in_flight=512, ramp=False, takes=frozenset({"base_url", "timeout_s", "connect_timeout_s"}), billing="free",
))  # fmt: skip
