"""A stand-in SGLang server on 127.0.0.1: the part of SGLang's HTTP API that eagle-data uses.

Endpoints as SGLang 0.5.23 serves them (`python/sglang/srt/entrypoints/http_server.py` of its wheel):
`/generate` (input_ids -> output_ids + meta_info), `/v1/chat/completions` (with `reasoning_content`),
`/health`, `/ready`, `/model_info` and `/server_info` with their deprecated aliases `/get_model_info` and
`/get_server_info` (same bodies). `api="old"` is an SGLang from before the rename (the aliases only, the
new names 404), `api="next"` one that removed the aliases as announced. `/server_info` carries one
stand-in extra, `cuda_visible_devices`, so a launcher test sees which GPUs a server was given.

Replies are deterministic functions of (seed, input): a test can recompute them, and servers with
different seeds give different tokens, so a test can tell which server answered. Some replies think
(`<think>` 151667 … `</think>` 151668, Qwen's ids), all end with `<|im_end|>` 151645 unless cut at
`max_new_tokens`. Like SGLang with `--skip-tokenizer-init`, `/generate` returns ids without `text`.

With a scoring model (`score_model`, a transformers folder; `--score-model`), `/generate` answers
`return_logprob` as SGLang does (`tokenizer_manager.add_logprob_to_meta_info` and the scheduler's
`_process_input_token_logprobs`): `meta_info.input_token_logprobs` holds one `[logprob, id, null]` per input
token from `logprob_start_len` on, the first with a null logprob; `input_top_logprobs` the `top_logprobs_num`
most likely at each (the first null); `output_token_logprobs` / `output_top_logprobs` the same for the reply's
ids; values from the real model. Without one it ignores those fields (a server that does not honour them).

Every answered request is appended to `--log` (one JSON line, flushed before the reply is sent), so a
test can count answers per prompt even for a server it SIGKILLed.

Run as SGLang would be: `python -m eagle_data.standins.sglang_fake --model-path M --port N`;
unknown SGLang flags are accepted and ignored, so the launcher can start it in place of sglang.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

from eagle_data import settings
from eagle_data.standins import model_logprobs
from eagle_data.standins.drip import drip

THINK_START, THINK_END, IM_END = 151667, 151668, 151645
NEWLINE, DOUBLE_NEWLINE = 198, 271
PROMPT_ID_HEADER = "X-Eagle-Prompt-Id"  # what eagle-data's engines send; a stand-in imports no client code
# The introspection paths each SGLang generation serves (see the module docstring).
APIS = {
    "0.5.23": ("/model_info", "/server_info", "/get_model_info", "/get_server_info"),
    "old": ("/get_model_info", "/get_server_info"),
    "next": ("/model_info", "/server_info"),
}
WORDS = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta")


def reply_ids(seed: int, input_ids: list[int], max_new_tokens: int) -> tuple[list[int], dict[str, Any]]:
    """The output ids and SGLang-shaped finish_reason for one prompt (pure; tests recompute it)."""
    rng = _rng(seed, input_ids)
    body: list[int] = []
    thinking_off = input_ids[-2:] == [THINK_END, DOUBLE_NEWLINE]  # the prompt already closed an empty think block
    if not thinking_off and rng.random() < 0.5:
        body += [THINK_START, NEWLINE, *(rng.randrange(1000, 50000) for _ in range(rng.randrange(3, 30)))]
        body += [NEWLINE, THINK_END, DOUBLE_NEWLINE]
    body += [rng.randrange(1000, 50000) for _ in range(rng.randrange(2, 30))]
    body.append(IM_END)
    if len(body) > max_new_tokens:
        return body[:max_new_tokens], {"type": "length", "length": max_new_tokens}
    return body, {"type": "stop", "matched": IM_END}


def _rng(seed: int, key: object) -> random.Random:
    digest = hashlib.sha256(json.dumps([seed, key]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class FakeSGLang:
    """State of one stand-in server: its settings, the answer log and the in-flight count."""

    def __init__(
        self,
        *,
        model: str,
        seed: int = 0,
        delay_s: float = 0.0,
        log_path: str | None = None,
        unhealthy: bool = False,
        fail_status: int = 0,
        drip_s: float = 0.0,
        api: str = "0.5.23",
        served_model_name: str = "",
        max_running_requests: int = 8,
        score_model: str = "",
    ) -> None:
        if api not in APIS:
            raise ValueError(f"api {api!r}: one of {sorted(APIS)}")
        self.model, self.seed, self.delay_s, self.unhealthy = model, seed, delay_s, unhealthy
        self.api, self.served_model_name = api, served_model_name or model
        self.max_running_requests = max_running_requests
        self.score_model = score_model  # a checkpoint folder: return_logprob answered with its real values
        self.hits: Counter[str] = Counter()  # GET path -> times asked
        self.drip_s = drip_s  # nonzero: /generate sends its answer one byte at a time, this many seconds apart
        self.fail_status = fail_status  # nonzero: /generate answers this HTTP status, as SGLang's errors
        self.log = Path(log_path).open("a", encoding="utf-8") if log_path else None  # noqa: SIM115
        self.requests: list[dict[str, Any]] = []  # every body received, answered or not
        self.answers: list[dict[str, Any]] = []
        self.running = self.max_running = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.health)  # 0.5.23: whether it takes new requests
        for path in APIS[self.api]:
            app.router.add_get(path, self.model_info if "model" in path else self.server_info)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self.log:
            self.log.close()

    async def health(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        return web.Response(status=503 if self.unhealthy else 200)

    async def model_info(self, request: web.Request) -> web.Response:
        """0.5.23's `/model_info` fields (those a text-only model has)."""
        self.hits[request.path] += 1
        info = {
            "model_path": self.model, "served_model_name": self.served_model_name, "tokenizer_path": self.model,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False, "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
        }  # fmt: skip
        return web.json_response(info)

    async def server_info(self, request: web.Request) -> web.Response:
        """0.5.23's `/server_info`: the resolved server args, the scheduler's info, per-DP internal states."""
        self.hits[request.path] += 1
        return web.json_response(
            {
                "model_path": self.model,
                "served_model_name": self.served_model_name,
                "skip_tokenizer_init": True,
                "max_running_requests": self.max_running_requests,
                "tp_size": 1,
                "dp_size": 1,
                "status": "ready",
                "max_total_num_tokens": 65536,
                "max_req_input_len": 32762,
                "internal_states": [{"effective_max_running_requests_per_dp": self.max_running_requests}],
                "version": "0.5.23",
                "frontend": "python",
                "cuda_visible_devices": settings.get("CUDA_VISIBLE_DEVICES"),
            }
        )

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.fail_status:
            error = {"object": "error", "message": "fake failure", "code": self.fail_status}
            return web.json_response(error, status=self.fail_status)
        input_ids = body["input_ids"]
        params = body.get("sampling_params", {})
        output_ids, finish = reply_ids(self.seed, input_ids, int(params.get("max_new_tokens", 128)))
        if self.score_model:  # a real model answers with its own greedy tokens
            output_ids, finish = model_logprobs.greedy(
                self.score_model, input_ids, int(params.get("max_new_tokens", 128))
            )
        await self._work(input_ids)
        meta = {
            "id": body.get("rid", ""),
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(output_ids),
            "cached_tokens": 0,
        }
        if body.get("return_logprob") and self.score_model:
            start, k = int(body.get("logprob_start_len", -1)), int(body.get("top_logprobs_num") or 0)
            meta |= model_logprobs.sglang_logprobs(self.score_model, input_ids, output_ids, start, k)
        answer = {"output_ids": output_ids, "meta_info": meta}
        if self.drip_s:
            return await drip(request, json.dumps(answer).encode(), self.drip_s)
        self._record(request, "generate", body.get("rid", ""), output_ids, len(input_ids))
        return web.json_response(answer)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        key = [m.get("content", "") for m in body["messages"]]
        rng = _rng(self.seed, key)
        thinking = body.get("chat_template_kwargs", {}).get("enable_thinking", True)
        reasoning = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 20))) if thinking else ""
        words = [rng.choice(WORDS) for _ in range(rng.randrange(2, 30))]
        limit = int(body.get("max_tokens") or 1 << 30)
        finish = "length" if len(words) > limit else "stop"
        content = " ".join(words[:limit])
        await self._work(key)
        self._record(request, "chat", body.get("rid", ""), content)
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        usage = {
            "prompt_tokens": sum(len(k.split()) for k in key),
            "completion_tokens": len(reasoning.split()) + min(len(words), limit),
        }
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
        )

    async def _work(self, key: object) -> None:
        """Take a deterministic 0.5x-1.5x of `delay_s`, counted as running."""
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.delay_s * (0.5 + _rng(self.seed, key).random()))
        finally:
            self.running -= 1

    def _record(self, request: web.Request, kind: str, rid: str, output: object, prompt_tokens: int = 0) -> None:
        entry = {
            "kind": kind,
            "rid": rid,
            "prompt_id": request.headers.get(PROMPT_ID_HEADER, ""),  # "" behind sglang-router: it drops the header
            "prompt_tokens": prompt_tokens,  # with prompt_id, tells a conversation's turns apart
            "port": request.transport.get_extra_info("sockname")[1] if request.transport else 0,
            "output": output,
            "t": time.time(),
        }
        self.answers.append(entry)
        if self.log:
            self.log.write(json.dumps(entry) + "\n")
            self.log.flush()


def free_port_block(n: int, start: int = 41000, stop: int = 64000) -> int:
    """A base port with `n` free ports after it on 127.0.0.1 (bind-tested), for servers started by port.
    A range below the kernel's ephemeral ports (32768 up) is never taken by an outgoing connection meanwhile."""
    for base in range(start + (os.getpid() % 1000) * 17 % (stop - start - n), stop - n, 7):
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + n):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", "--model", dest="model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=None, help="default: the port (servers differ)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per request (0.5x-1.5x)")
    parser.add_argument("--log", default=None, help="append one JSON line per answer; {port} is filled in")
    parser.add_argument("--unhealthy", action="store_true", help="/health answers 503 forever")
    parser.add_argument("--served-model-name", default="")
    parser.add_argument("--max-running-requests", type=int, default=8)
    parser.add_argument("--api", choices=sorted(APIS), default="0.5.23", help="which introspection paths it serves")
    parser.add_argument("--score-model", default="", help="a transformers folder: answer return_logprob with it")
    args, ignored = parser.parse_known_args(argv)
    server = FakeSGLang(
        model=args.model,
        seed=args.port if args.seed is None else args.seed,
        delay_s=args.delay,
        log_path=args.log.format(port=args.port) if args.log else None,
        unhealthy=args.unhealthy,
        api=args.api,
        served_model_name=args.served_model_name,
        max_running_requests=args.max_running_requests,
        score_model=args.score_model,
    )
    print(f"fake sglang: model={args.model} port={args.port} ignored={ignored}", flush=True)
    if args.unhealthy:
        print("fake sglang: loading weights (never finishes)", flush=True)
    web.run_app(server.app(), host=args.host, port=args.port, print=None, handle_signals=True)


if __name__ == "__main__":
    main(sys.argv[1:])
