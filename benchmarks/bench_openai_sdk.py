"""Would the openai SDK hold the generation floor? The pipeline on the SDK vs a bare aiohttp loop, in one run.

The OpenAI-compatible engine's request method is swapped for one on the SDK (openai >= 2 with
`openai[aiohttp]`'s `DefaultAioHttpClient`, no SDK retries, `with_raw_response` for the headers, our request
fields through `extra_body`), and `bench_generation`'s own server, baseline and `pipeline()` run around it.
Needs `pip install "openai[aiohttp]"` (no dependency of the project: nothing in eagle_data uses it).
The floor is 0.9x the bare loop; the SDK measured 0.29x here
(docs/facts.md), so the engine stays on aiohttp.

    PYTHONPATH=. python benchmarks/bench_openai_sdk.py [--requests 10000] [--in-flight 2000] [--latency 1.0]
Last line: `RESULT openai_sdk_vs_aiohttp <ratio>`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai

from benchmarks import bench_generation as bench
from eagle_data.engines.openai_compat import OpenAICompatEngine
from eagle_data.types import PROMPT_ID_HEADER, Completion, Message, RetryableError

TYPED = ("model", "max_tokens", "temperature", "top_p")  # the SDK's own arguments; the rest goes in extra_body


async def sdk_complete(self: OpenAICompatEngine, messages: list[Message], prompt_id: str, overrides: dict[str, Any]):
    """The engine's `_complete` on the SDK: typed errors mapped to ours, the reply read from the parsed model."""
    if self._session is None:
        client = openai.DefaultAioHttpClient()
        self._session = openai.AsyncOpenAI(base_url=self.base, api_key="unused", max_retries=0,
                                           timeout=self.timeout_s, http_client=client)  # fmt: skip
    body = {**self._body, **overrides}
    typed = {k: body.pop(k) for k in TYPED if k in body}
    turns = [{"role": m["role"], "content": m["content"]} for m in messages]
    try:
        raw = await self._session.chat.completions.with_raw_response.create(
            messages=turns, **typed, extra_body=body, extra_headers={PROMPT_ID_HEADER: prompt_id}
        )
    except openai.RateLimitError as exc:
        raise RetryableError(str(exc), kind="http_429", throttle=True) from None
    except openai.APIStatusError as exc:
        raise RetryableError(str(exc), kind=f"http_{exc.status_code}") from None
    except openai.APIConnectionError as exc:  # APITimeoutError included
        raise RetryableError(str(exc), kind="connect") from None
    reply = raw.parse()
    usage = reply.usage
    return Completion(content=reply.choices[0].message.content or "", finish_reason=reply.choices[0].finish_reason,
                      prompt_tokens=usage.prompt_tokens if usage else 0,
                      completion_tokens=usage.completion_tokens if usage else 0, served_model=reply.model)  # fmt: skip


async def sdk_aclose(self: OpenAICompatEngine) -> None:
    if self._session is not None:
        session, self._session = self._session, None
        await session.close()


def main(argv: list[str] | None = None) -> float:
    args = bench.parse_args(argv, other="SDK")
    n = args.requests // bench.SHARD_SIZE * bench.SHARD_SIZE
    OpenAICompatEngine._complete, OpenAICompatEngine.aclose = sdk_complete, sdk_aclose  # type: ignore[method-assign]
    proc, url = bench.start_server(args.latency)
    try:
        bare, sdk = [], []
        for _ in range(args.rounds):
            bare.append(asyncio.run(bench.bare_loop(url, n, args.in_flight)))
            cpu = time.process_time()
            sdk.append(bench.pipeline(url, n, args.in_flight, args.in_flight)[0])
            print(f"bare aiohttp {bare[-1]:.0f} req/s, pipeline on the openai SDK {sdk[-1]:.0f} req/s "
                  f"({(time.process_time() - cpu) / n * 1e6:.0f} us CPU/req)", flush=True)  # fmt: skip
    finally:
        proc.kill()
    ratio = max(sdk) / max(bare)
    print(f"RESULT openai_sdk_vs_aiohttp {ratio:.3f}")
    return ratio


if __name__ == "__main__":
    main()
