"""A server that answers one request at a time is noticed and said in one line, then sent one at a time; a
request given up at the timeout is counted and said (engines/pacing.py).

Against the real `transformers serve` on SmolLM2-135M-Instruct (a real model, so answers take seconds as
they do in use: a few prompts of 8 tokens), and against the openai stand-in for a server that answers
requests together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle_data.engines import make_engine
from eagle_data.engines.openai_compat import OpenAICompatEngine
from eagle_data.engines.pacing import _Sent, one_at_a_time
from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data.types import Completion, RetryableError
from eagle_data_tests.integration.test_transformers_serve import _serve, _wait

QUESTIONS = ("Why is the sky blue?", "What is a prime number?", "Describe a cat.", "What is photosynthesis?")


def _answers(*seen: tuple[float, int]) -> list[_Sent]:
    """(latency, tokens) of the answers in the order they came back, sent in that order."""
    return [_Sent(i, 0.0, latency, tokens) for i, (latency, tokens) in enumerate(seen, start=1)]


def test_one_at_a_time_is_told_from_answers_that_overlap():
    assert one_at_a_time(_answers((5.8, 24), (12.0, 24), (17.1, 24)))  # transformers serve, measured
    assert not one_at_a_time(_answers((5.8, 24), (6.0, 24), (6.1, 24)))  # answered together
    assert not one_at_a_time(_answers((2.0, 10), (8.0, 40), (16.0, 80)))  # together, each as long as its reply
    assert not one_at_a_time([_Sent(2, 0, 5.8, 24), _Sent(1, 0, 12.0, 24), _Sent(3, 0, 17.1, 24)])  # not in order


def _openai(base_url: str, model: str, timeout_s: float, max_tokens: int = 8) -> OpenAICompatEngine:
    return make_engine("openai", base_url=base_url, model=model, api_key_env="", max_tokens=max_tokens,
                       temperature=0.0, thinking=False, timeout_s=timeout_s)  # fmt: skip


async def _ask(engine: OpenAICompatEngine, questions: tuple[str, ...]) -> list[Completion | BaseException]:
    try:
        return await asyncio.gather(
            *(engine.complete([{"role": "user", "content": q}], prompt_id=f"q{i}") for i, q in enumerate(questions)),
            return_exceptions=True,
        )
    finally:
        await engine.aclose()


@pytest.fixture(scope="module")
def serve(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, model) of `transformers serve` on SmolLM2, its model loaded by one first request."""
    model = str(smollm2)
    proc, url = _serve(tmp_path_factory.mktemp("serve-home"))
    try:
        _wait(proc, url)
        asyncio.run(_ask(_openai(f"{url}/v1", model, 120.0), QUESTIONS[:1]))
        yield f"{url}/v1", model
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_transformers_serve_is_seen_answering_one_at_a_time_and_is_then_sent_one_at_a_time(serve: tuple[str, str]):
    engine = _openai(*serve, timeout_s=40.0, max_tokens=16)  # judged from 2 s on (a twentieth of 40 s): the fourth
    # answer, one after another, came back past a 20-s timeout at load 10
    first = asyncio.run(_ask(engine, QUESTIONS))
    assert all(isinstance(done, Completion) and done.completion_tokens for done in first)
    assert engine.pacing.serial and "the server answers one request at a time" in engine.stats_line()
    assert engine.stats() == {"answers_one_at_a_time": True, "abandoned_requests": 0}

    most = 0

    async def watched() -> list[Completion | BaseException]:
        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, engine.pacing._outstanding)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            return await _ask(engine, QUESTIONS[:3])
        finally:
            watcher.cancel()

    assert all(isinstance(done, Completion) for done in asyncio.run(watched()))
    assert most == 1  # three asked at once, sent one after another


def test_a_request_given_up_at_the_timeout_is_counted_and_said(serve: tuple[str, str]):
    engine = _openai(*serve, timeout_s=0.5, max_tokens=64)  # 64 tokens take this server seconds
    (failed,) = asyncio.run(_ask(engine, QUESTIONS[:1]))
    assert isinstance(failed, RetryableError) and failed.kind == "timeout"
    assert engine.stats() == {"answers_one_at_a_time": False, "abandoned_requests": 1}
    assert engine.stats_line() == (
        "1 request(s) given up at the 0.5 s timeout: the server may still be generating them while they are asked "
        "again"
    )


def test_a_server_answering_together_is_left_at_full_width():
    server = FakeOpenAI(Faults(latency_s=1.2, reply_tokens=(8, 8)))
    base_url = server.start()
    try:
        engine = _openai(base_url, "fake", timeout_s=20.0)
        done = asyncio.run(_ask(engine, QUESTIONS))
    finally:
        server.stop()
    assert all(isinstance(d, Completion) for d in done)
    assert not engine.pacing.serial and engine.stats_line() == "" and engine.stats() == {}
