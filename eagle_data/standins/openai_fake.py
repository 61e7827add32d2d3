"""A fault-injecting OpenAI-compatible server on 127.0.0.1 (aiohttp), in a thread or a subprocess.

Serves `POST {/v1,/api/v1}/chat/completions`, `POST /v1/completions` (vLLM's `prompt_logprobs`, computed with a real
model: `Faults.score_model`; ignored without one), `GET {/v1,/api/v1}/models`, `GET /api/v1/key`, and for
tests `GET /_stats`, `POST /_faults`. Replies are deterministic per prompt: the natural length of a prompt's reply is
fixed by its id, so raising max_tokens un-truncates exactly the rows that hit the old cap. Requests
are counted per prompt and turn (prompt id from the `X-Eagle-Prompt-Id` header, else `user`), and
successful answers separately, so a test can prove no finished prompt was paid for twice.

Subprocess: `python -m eagle_data.standins.openai_fake --faults '{"latency_s": 1}'` prints
`READY <port>` and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import threading
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import polars as pl
from aiohttp import web

from eagle_data.catalog import DatasetSpec, load_catalog
from eagle_data.standins import model_logprobs
from eagle_data.standins.drip import drip
from eagle_data.standins.reply_shapes import chat_logprobs, fake_reply, shaped_message, token_ids
from eagle_data.targets import load_target
from eagle_data.types import PROMPT_ID_HEADER


@dataclass
class Faults:
    """What goes wrong, and how often. Probabilities are per request, drawn in this order."""

    latency_s: float = 0.0
    latency_jitter_s: float = 0.0  # uniform extra latency
    latency_sigma: float = 0.0  # log-normal spread: latency_s * lognormvariate(0, sigma) (a long tail)
    rate_limit_first: int = 0  # for the first N requests received, rate-limit (429) ...
    rate_limit_cap: int = 0  # ... those above this many open requests (0: all of them)
    retry_after: str = "1"  # Retry-After sent with 429 ("" for none)
    p_5xx: float = 0.0
    p_reset: float = 0.0
    p_hang: float = 0.0
    hang_s: float = 3600.0
    drip_s: float = 0.0  # send each reply one byte at a time, this many seconds apart (a slow-drip server)
    p_error_body: float = 0.0  # HTTP 200 with an `error` object
    p_finish_error: float = 0.0  # HTTP 200 with finish_reason "error"
    force_status: int = 0  # answer every request with this status ...
    force_reason: str = ""  # ... and this metadata.reason
    fail_turn: int = 0  # answer every request for this user turn (1-based) with HTTP 500
    reply_tokens: tuple[int, int] = (20, 60)  # natural reply length range, fixed per prompt
    shape: str = "split"  # how the reply's text comes back: one of reply_shapes.SHAPES
    fixed_text: str | None = None  # every reply's content is this text, no reasoning ("" for empty replies) ...
    reported_tokens: int = 0  # ... with this many completion tokens reported (0: one per word of the text)
    poison_prompts: tuple[str, ...] = ()  # these prompts' replies hold a lone surrogate ("\\ud800" in the JSON)
    echo_auth: bool = False  # error bodies repeat the Authorization header received (a careless server)
    served_models: tuple[str, ...] = ()  # the ids GET /models lists (none: an empty list, which no engine checks)
    ignore_token_ids: bool = False  # answer `return_token_ids` without ids (a server that does not know the field)
    ignore_logprobs: bool = False  # answer `logprobs` without them (a server or provider that does not take the field)
    cost_per_token: float = 1e-6
    key_limit: float = 100.0
    key_usage: float = 12.5
    seed: int = 0
    # Replies that lose their text, billed in full (the breaker's faults): after `healthy_first` answers,
    # each answer is empty or one character with these probabilities; usage reports the whole reply.
    healthy_first: int = 0
    p_empty: float = 0.0
    p_lost_text: float = 0.0
    # A server whose chat template is not its model's (seen only in the prompt ids `return_token_ids` reports): it
    # writes this preamble at the head of the system turn, opening one where a conversation has none, as Llama
    # 3.1's template writes its knowledge dates.
    system_preamble: str = ""
    # The target whose rendering counts a request's `prompt_tokens` (as a real server counts its own template's
    # tokens); "checkpoint:<folder>" counts as that model's own template does (e.g. SmolLM2's default system turn).
    prompt_target: str = "qwen3-test"
    # A transformers folder of Qwen's vocabulary: /v1/completions answers prompt_logprobs, and chat answers `logprobs`
    # (else made-up values), with its real values.
    score_model: str = ""


class FakeOpenAI:
    """The app and its counters; `start()` runs it on a background thread's own loop."""

    def __init__(self, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        self.rng = random.Random(self.faults.seed)
        self.requests: Counter[str] = Counter()  # per "prompt_id#turn"
        self.answered: Counter[str] = Counter()  # successful (ok or truncated) answers per "prompt_id#turn"
        self.outcomes: Counter[str] = Counter()
        self.auth_headers: set[str] = set()
        self.settings: dict[str, dict[str, Any]] = {}  # per "prompt_id#turn": the request's fields but messages
        self.received = 0
        self.billed_usd = 0.0  # the `cost` of every answer sent
        self.open = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    # ---- app ---------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        for prefix in ("/v1", "/api/v1"):
            app.router.add_post(f"{prefix}/chat/completions", self.chat)
            app.router.add_get(f"{prefix}/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/api/v1/key", self.key)
        app.router.add_get("/_stats", self.stats_view)
        app.router.add_post("/_faults", self.set_faults)
        return app

    def stats(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "requests": dict(self.requests),
            "answered": dict(self.answered),
            "outcomes": dict(self.outcomes),
            "billed_usd": self.billed_usd,
            "auth_headers": sorted(self.auth_headers),
        }

    async def stats_view(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def set_faults(self, request: web.Request) -> web.Response:
        self.faults = Faults(**{**dataclasses.asdict(self.faults), **await request.json()})
        return web.json_response({"ok": True})

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": name, "object": "model", "owned_by": "fake"} for name in self.faults.served_models]
        return web.json_response({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.Response:
        """vLLM's `/v1/completions` with a prompt of token ids: one empty completion token, and with a scoring
        model the prompt's log-probabilities (`CompletionResponseChoice.prompt_logprobs`, model_logprobs.py)."""
        body, self.received = await request.json(), self.received + 1
        ids, k, model = [int(t) for t in body["prompt"]], body.get("prompt_logprobs"), self.faults.score_model
        listed = model_logprobs.vllm_prompt_logprobs(model, ids, int(k)) if k is not None and model else None
        choice = {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": listed}
        usage = {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
        return web.json_response({"id": "cmpl-fake", "object": "text_completion", "created": 0,
                                  "model": body.get("model", ""), "choices": [choice], "usage": usage})  # fmt: skip

    async def key(self, request: web.Request) -> web.Response:
        self.auth_headers.add(request.headers.get("Authorization", ""))
        if self.faults.force_status:
            return self._error(self.faults.force_status, "User not found.", {})
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return web.json_response({"error": {"code": 401, "message": "No auth credentials found"}}, status=401)
        f = self.faults
        data = {
            "label": "sk-or-...xyz",
            "usage": f.key_usage,
            "limit": f.key_limit,
            "limit_remaining": f.key_limit - f.key_usage,
            "is_free_tier": False,
        }
        return web.json_response({"data": data})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.received += 1
        self.open += 1
        try:
            return await self._chat(request, self.received)
        finally:
            self.open -= 1

    async def _chat(self, request: web.Request, nth: int) -> web.StreamResponse:
        f, rng = self.faults, self.rng
        body = await request.json()
        messages = body["messages"]
        prompt_id = request.headers.get(PROMPT_ID_HEADER) or body.get("user", "")
        turn = f"{prompt_id}#{sum(m['role'] == 'user' for m in messages)}"
        self.requests[turn] += 1
        self.settings[turn] = {k: v for k, v in body.items() if k != "messages"}
        self.auth_headers.add(request.headers.get("Authorization", ""))
        if f.force_status:
            echoed = f" (got {request.headers.get('Authorization', '')})" if f.echo_auth else ""
            return self._error(f.force_status, f"forced {f.force_status}{echoed}", {"reason": f.force_reason})
        if f.fail_turn and turn.endswith(f"#{f.fail_turn}"):
            return self._error(500, f"turn {f.fail_turn} always fails", {})
        if nth <= f.rate_limit_first and (not f.rate_limit_cap or self.open > f.rate_limit_cap):
            self.outcomes["429"] += 1
            return self._error(429, "rate limited", {}, {"Retry-After": f.retry_after} if f.retry_after else {})
        spread = rng.lognormvariate(0.0, f.latency_sigma) if f.latency_sigma else 1.0
        await asyncio.sleep(f.latency_s * spread + rng.random() * f.latency_jitter_s)
        draw = rng.random()
        for name, p in (("5xx", f.p_5xx), ("reset", f.p_reset), ("hang", f.p_hang),
                        ("error_body", f.p_error_body), ("finish_error", f.p_finish_error)):  # fmt: skip
            if draw < p:
                self.outcomes[name] += 1
                return await self._fault(name, request)
            draw -= p
        reply = self._reply(body, prompt_id, turn)
        if f.drip_s:
            assert isinstance(reply.body, bytes)
            return await drip(request, reply.body, f.drip_s)
        return reply

    async def _fault(self, name: str, request: web.Request) -> web.StreamResponse:
        if name == "5xx":
            return self._error(self.rng.choice([500, 502, 503]), "upstream failure", {})
        if name == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if name == "hang":
            await asyncio.sleep(self.faults.hang_s)
            return self._error(504, "hung", {})
        if name == "error_body":
            return web.json_response({"error": {"code": 502, "message": "provider died mid-generation"}})
        return web.json_response({"choices": [{"message": {"content": "partial"}, "finish_reason": "error"}]})

    def _error(
        self, status: int, message: str, metadata: dict[str, Any], headers: dict[str, str] | None = None
    ) -> web.Response:
        body = {"error": {"code": status, "message": message, "metadata": metadata}}
        return web.json_response(body, status=status, headers=headers)

    def _reply(self, body: dict[str, Any], prompt_id: str, turn: str) -> web.Response:
        lo, hi = self.faults.reply_tokens
        natural = lo + zlib.crc32(turn.encode()) % (hi - lo + 1)
        cap = int(body.get("max_tokens") or natural)
        n = min(natural, cap)
        finish = "length" if natural > cap else "stop"
        self.outcomes["truncated" if finish == "length" else "ok"] += 1
        self.answered[turn] += 1
        prompt_tokens = self._prompt_tokens(body)
        poison = "\ud800" if prompt_id in self.faults.poison_prompts else ""
        message = shaped_message(self.faults.shape, fake_reply(turn, n) + poison, f"think {turn}")
        message = self._lose_text(message)
        if self.faults.shape == "special_only":
            n, finish = cap, "length"
        if self.faults.fixed_text is not None:  # a broken server or model: the same text, whatever was asked
            message = {"role": "assistant", "content": self.faults.fixed_text}
            n, finish = self.faults.reported_tokens or len(self.faults.fixed_text.split()), "stop"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
            "completion_tokens_details": {"reasoning_tokens": 2},
            "cost": round((prompt_tokens + n) * self.faults.cost_per_token, 9),
        }
        self.billed_usd += usage["cost"]
        reply = {
            "id": f"gen-{turn}",
            "object": "chat.completion",
            "model": body.get("model", ""),
            "provider": "FakeProvider",
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": usage,
        }
        return web.json_response(self._with_tokens(reply, body, message, finish))

    def _with_tokens(
        self, reply: dict[str, Any], body: dict[str, Any], message: dict[str, Any], finish: str
    ) -> dict[str, Any]:
        """`reply` with what the request asked for of its tokens, as a vLLM server of a Qwen3 model answers:
        `return_token_ids` (the prompt under the server's template, with its `system_preamble`, and the reply's ids)
        and `logprobs` (each reply token's, with `top_logprobs` of them)."""
        f, choice = self.faults, reply["choices"][0]
        ids, logprobs = body.get("return_token_ids") and not f.ignore_token_ids, body.get("logprobs")
        if not ids and not (logprobs and not f.ignore_logprobs):
            return reply
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        prompt, given = body["messages"], int(body["messages"][0]["role"] == "system")
        if f.system_preamble:
            prompt = [{"role": "system", "content": f.system_preamble + (prompt[0]["content"] if given else "")},
                      *prompt[given:]]  # fmt: skip
        prompt_ids, reply_ids = token_ids(prompt, message, finish, thinking)
        if ids:
            reply["prompt_token_ids"], choice["token_ids"] = prompt_ids, reply_ids
        if logprobs and not f.ignore_logprobs:
            k = int(body.get("top_logprobs") or 0)
            if f.score_model:  # the model's real values, listed as vLLM lists them
                choice["logprobs"] = {"content": model_logprobs.vllm_chat_logprobs(f.score_model, prompt_ids,
                                                                                   reply_ids, k)}  # fmt: skip
            else:
                choice["logprobs"] = {"content": chat_logprobs(reply_ids, k)}
        return reply

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        """What the server counts: the request's messages as the prompt target renders them, with the thinking
        switch the request carries (chat_template_kwargs, else OpenRouter's `reasoning.enabled`)."""
        kwargs, reasoning = body.get("chat_template_kwargs") or {}, body.get("reasoning") or {}
        thinking = bool(kwargs.get("enable_thinking", reasoning.get("enabled", True)))
        target = load_target(self.faults.prompt_target)
        if not target.think_ids:
            thinking = False
        messages = [{"role": m["role"], "content": m.get("content") or ""} for m in body["messages"]]
        return len(target.prompt_ids(messages, thinking=thinking))

    def _lose_text(self, message: dict[str, Any]) -> dict[str, Any]:
        """The reply-text faults (see Faults.healthy_first), drawn after the first healthy answers."""
        f = self.faults
        if sum(self.answered.values()) <= f.healthy_first or not (f.p_empty or f.p_lost_text):
            return message
        draw = self.rng.random()
        if draw < f.p_empty:
            self.outcomes["empty"] += 1
            return {"role": "assistant", "content": ""}
        if draw < f.p_empty + f.p_lost_text:
            self.outcomes["lost_text"] += 1
            return {"role": "assistant", "content": "x"}
        return message

    # ---- running -----------------------------------------------------------------------------------
    async def serve(self, port: int = 0) -> int:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, backlog=4096)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    def start(self) -> str:
        """Serve on a background thread; returns the OpenAI base URL (`http://127.0.0.1:PORT/v1`). The prompt
        target's tokenizer is loaded first, so no answer waits for it (a test's timeout may be a fraction of that)."""
        load_target(self.faults.prompt_target)
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.serve())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True, name="fake-openai").start()
        ready.wait(10)
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(self._runner), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)

    @staticmethod
    async def _shutdown(runner: web.AppRunner) -> None:
        await runner.cleanup()
        hung = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)


def prompt_shards(shards: int, per_shard: int, turns: int = 1, dataset: str = "b7_sharegpt") -> dict[str, pl.DataFrame]:
    """Prompts frames (partition key -> frame) for the fake to answer: `turns` user turns each."""
    out = {}
    for s in range(shards):
        ids = [f"s{s}-p{i}" for i in range(per_shard)]
        messages = [
            [m for t in range(turns) for m in ({"role": "user", "content": f"question {t} of {pid}"},
                                               {"role": "assistant", "content": "an old reply"})]
            for pid in ids
        ]  # fmt: skip
        out[f"{s:05d}"] = pl.DataFrame({
            "prompt_id": ids, "dataset": dataset, "shard": s, "messages": messages,
            "source_id": ids, "source_row": list(range(per_shard)),
        })  # fmt: skip
    return out


def spec_for_tests(**update: Any) -> DatasetSpec:
    """The b7_sharegpt entry (regenerate all), no budgets unless given, without any profile overlay; its
    target's vocabulary ships with the package, so the pre-flight of generation needs no download."""
    base = {"token_budget": 0, "cost_budget_usd": 0.0, "regenerate": "all", "target": "qwen3-test"}
    return load_catalog(profile="")["b7_sharegpt"].model_copy(update={**base, **update})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--faults", default="{}", help="JSON object of Faults fields")
    args = parser.parse_args()
    server = FakeOpenAI(Faults(**json.loads(args.faults)))

    async def run() -> None:
        port = await server.serve(args.port)
        print(f"READY {port}", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
