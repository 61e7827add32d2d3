"""SGLang engine against stand-in SGLang servers on 127.0.0.1, with the real Qwen vocabulary."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from eagle_data.engines.launcher import LaunchConfig, Launcher
from eagle_data.engines.replies import split_ids
from eagle_data.engines.served import ModelMismatchError, model_matches
from eagle_data.engines.sglang import (
    Codec,
    SGLangEngine,
    SGLangSettings,
    codec_for,
    normalize_finish,
)
from eagle_data.engines.sglang_fleet import stats_line
from eagle_data.standins.sglang_fake import (
    IM_END,
    THINK_END,
    THINK_START,
    FakeSGLang,
    free_port_block,
    reply_ids,
)
from eagle_data.targets import load_target
from eagle_data.targets.vocab import qwen_tokenizer
from eagle_data.types import FatalError, Message, RetryableError

MODEL = "Qwen/Qwen3-8B"
REPO = Path(__file__).resolve().parents[2]
FAKE = (sys.executable, "-m", "eagle_data.standins.sglang_fake")


def chatml_prompt_ids(messages: list[Message], thinking: bool) -> list[int]:
    """An independent ChatML renderer (Qwen3's generation prompt): the reference the real codec must match."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    text += "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
    return qwen_tokenizer().encode(text, add_special_tokens=False).ids


def qwen_codec() -> Codec:
    return codec_for(load_target("qwen3-test"))


def conversation(i: int) -> list[Message]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Question number {i}?"}]


@contextlib.asynccontextmanager
async def fake_server(**kwargs: object) -> AsyncIterator[tuple[str, FakeSGLang]]:
    """An in-process stand-in on a free port."""
    fake = FakeSGLang(**{"model": MODEL, **kwargs})  # type: ignore[arg-type]
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", fake
    finally:
        await runner.cleanup()


def engine(urls: list[str], **options: object) -> SGLangEngine:
    settings = SGLangSettings(**{"urls": tuple(urls), "model": MODEL, "max_new_tokens": 40, "reprobe_s": 0.2,
                                 **options})
    return SGLangEngine(settings, qwen_codec())


def test_generate_returns_the_servers_output_ids_with_reasoning_split() -> None:
    async def run() -> None:
        async with fake_server(seed=7) as (url, fake):
            eng = engine([url])
            try:
                replies = [await eng.complete(conversation(i), prompt_id=f"p{i}") for i in range(12)]
            finally:
                await eng.aclose()
        tok = qwen_tokenizer()
        for i, got in enumerate(replies):
            prompt = chatml_prompt_ids(conversation(i), True)
            want, finish = reply_ids(7, prompt, 40)
            assert got.output_ids == want
            assert got.finish_reason == {"stop": "stop", "length": "length"}[finish["type"]]
            assert got.prompt_tokens == len(prompt) and got.completion_tokens == len(want)
            body = want[:-1] if finish["type"] == "stop" else want
            if THINK_END in body:
                end = body.index(THINK_END)
                # qwen3's chat format strips "\n" around the reasoning and before the content, nothing else
                assert got.reasoning == tok.decode(body[1:end], skip_special_tokens=False).strip("\n")
                assert got.content == tok.decode(body[end + 1 :], skip_special_tokens=False).lstrip("\n")
                assert got.reasoning_tokens == end + 1
            assert "<|im_end|>" not in got.content
        assert {r.finish_reason for r in replies} == {"stop", "length"}  # both kinds were exercised
        assert any(r.reasoning for r in replies) and any(not r.reasoning for r in replies)
        assert [a["prompt_id"] for a in fake.answers] == [f"p{i}" for i in range(12)]

    asyncio.run(run())


def test_thinking_off_sends_the_empty_think_block_and_sampling_params() -> None:
    async def run() -> list[dict[str, object]]:
        async with fake_server() as (url, fake):
            eng = engine([url], thinking=False, temperature=0.6, top_p=0.9, top_k=20, min_tokens=5,
                         stop_token_ids=(IM_END,))
            try:
                await eng.complete(conversation(1), prompt_id="p1")
            finally:
                await eng.aclose()
        return fake.requests

    (body,) = asyncio.run(run())
    assert body["input_ids"] == chatml_prompt_ids(conversation(1), False)
    assert body["input_ids"][-4:] == [THINK_START, 271, THINK_END, 271]  # type: ignore[index]
    assert body["sampling_params"] == {
        "max_new_tokens": 40, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_new_tokens": 5,
        "stop_token_ids": [IM_END],
    }


def test_chat_mode_returns_reasoning_content() -> None:
    async def run() -> None:
        async with fake_server() as (url, fake):
            eng = SGLangEngine(SGLangSettings(urls=(url,), model=MODEL, mode="chat", max_new_tokens=10))
            try:
                replies = [await eng.complete(conversation(i), prompt_id=f"c{i}") for i in range(8)]
            finally:
                await eng.aclose()
        assert all(r.reasoning and r.output_ids is None for r in replies)
        assert {r.finish_reason for r in replies} == {"stop", "length"}
        assert [r.content for r in replies] == [a["output"] for a in fake.answers]

    asyncio.run(run())


def test_a_server_serving_another_model_is_a_clear_error() -> None:
    async def run() -> None:
        async with fake_server() as (good, _), fake_server(model="/models/Llama-3.1-8B") as (bad, _):
            eng = engine([good, bad])
            with pytest.raises(ModelMismatchError) as err:
                await eng.complete(conversation(0), prompt_id="p0")
            await eng.aclose()
        message = str(err.value)
        assert "\n" not in message and bad in message
        assert "/models/Llama-3.1-8B" in message and MODEL in message

    asyncio.run(run())


def test_dispatch_is_least_loaded_under_the_per_server_cap() -> None:
    async def run() -> None:
        async with fake_server(delay_s=0.05) as (a, fa), fake_server(delay_s=0.05) as (b, fb):
            eng = engine([a, b], max_in_flight_per_server=3)
            try:
                await asyncio.gather(*(eng.complete(conversation(i), prompt_id=f"p{i}") for i in range(30)))
                stats = eng.stats()
            finally:
                await eng.aclose()
        assert fa.max_running == 3 and fb.max_running == 3  # full, never over
        assert abs(len(fa.answers) - len(fb.answers)) <= 6
        assert stats["requests"] == 30 and stats["servers_up"] == 2 and stats["tok_s"] > 0
        assert [s["requests"] for s in stats["per_server"]] == [len(fa.answers), len(fb.answers)]
        assert stats_line(stats).startswith("servers_up 2/2 running 0 tok_s ")

    asyncio.run(run())


def test_a_503_fails_over_and_a_400_is_fatal() -> None:
    async def run() -> None:
        async with fake_server() as (good, fg), fake_server(fail_status=503) as (gone, fb):
            eng = engine([gone, good], reprobe_s=60)
            try:
                replies = await asyncio.gather(
                    *(eng.complete(conversation(i), prompt_id=f"p{i}") for i in range(6))
                )
                stats = eng.stats()
            finally:
                await eng.aclose()
        assert all(r.output_ids for r in replies) and len(fg.answers) == 6 and fb.requests
        assert stats["failovers"] >= 1 and [s["up"] for s in stats["per_server"]] == [False, True]
        async with fake_server(fail_status=400) as (bad, _):
            eng = engine([bad])
            with pytest.raises(FatalError) as err:
                await eng.complete(conversation(0), prompt_id="p0")
            await eng.aclose()
        assert err.value.kind == "http_400" and "fake failure" in str(err.value)

    asyncio.run(run())


def test_no_server_left_raises_retryable_server_down() -> None:
    async def run() -> None:
        async with fake_server() as (url, _):
            eng = engine([url], reprobe_s=60)
            await eng.start()
        with pytest.raises(RetryableError) as err:  # the server is gone now
            await eng.complete(conversation(0), prompt_id="p0")
        await eng.aclose()
        assert err.value.kind == "server_down"

    asyncio.run(run())


def test_a_server_that_comes_back_is_used_again() -> None:
    async def run() -> None:
        async with fake_server() as (a, _):
            port = int(a.rsplit(":", 1)[1])
            eng = engine([a], reprobe_s=0.1)
            await eng.start()
        with pytest.raises(RetryableError):
            await eng.complete(conversation(0), prompt_id="p0")
        fake = FakeSGLang(model=MODEL)
        runner = web.AppRunner(fake.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            for _ in range(50):
                if eng.stats()["servers_up"]:
                    break
                await asyncio.sleep(0.05)
            reply = await eng.complete(conversation(0), prompt_id="p0")
        finally:
            await eng.aclose()
            await runner.cleanup()
        assert reply.output_ids and len(fake.answers) == 1

    asyncio.run(run())


def test_the_engine_survives_a_new_event_loop(tmp_path: Path) -> None:
    config = LaunchConfig(model_path=MODEL, base_port=free_port_block(1), command=FAKE,
                          env={"PYTHONPATH": str(REPO)}, log_dir=str(tmp_path), health_timeout_s=30)
    with Launcher(config) as fleet:
        eng = engine(fleet.urls)

        async def one(i: int) -> list[int] | None:
            try:
                return (await eng.complete(conversation(i), prompt_id=f"p{i}")).output_ids
            finally:
                await eng.aclose()

        assert asyncio.run(one(1)) and asyncio.run(one(2))  # e.g. one asyncio.run per shard


def test_three_servers_one_killed_mid_run_nothing_lost_nothing_twice(tmp_path: Path) -> None:
    prompts = 90
    config = LaunchConfig(
        model_path=MODEL, num_servers=3, base_port=free_port_block(3),
        command=FAKE,
        extra_args=("--delay", "0.15", "--log", str(tmp_path / "answers-{port}.jsonl")),
        env={"PYTHONPATH": str(REPO)}, log_dir=str(tmp_path / "logs"), health_timeout_s=30,
    )
    with Launcher(config) as fleet:
        victim = fleet.servers[1]

        async def run() -> tuple[dict[str, list[int] | None], dict[str, object]]:
            eng = engine(fleet.urls, max_in_flight_per_server=4)
            tasks = {f"p{i}": asyncio.create_task(eng.complete(conversation(i), prompt_id=f"p{i}"))
                     for i in range(prompts)}
            while sum(t.done() for t in tasks.values()) < prompts // 4:
                await asyncio.sleep(0.01)
            os.killpg(victim.process.pid, signal.SIGKILL)  # mid-run: it has requests in flight
            try:
                results = {pid: (await task).output_ids for pid, task in tasks.items()}
            finally:
                stats = eng.stats()
                await eng.aclose()
            return results, stats

        results, stats = asyncio.run(run())
        assert victim.process.wait(timeout=5) == -signal.SIGKILL

    answers = {
        port: [json.loads(line) for line in (tmp_path / f"answers-{port}.jsonl").read_text().splitlines()]
        for port in (config.base_port + i for i in range(3))
    }
    victim_port = config.base_port + 1
    survivors = Counter(a["prompt_id"] for port, rows in answers.items() if port != victim_port for a in rows)
    assert len(results) == prompts  # 0 lost: every prompt has its one Completion
    assert max(survivors.values()) == 1  # 0 duplicated: no prompt answered twice by a live server
    for pid, output_ids in results.items():
        sent = [a["output"] for rows in answers.values() for a in rows if a["prompt_id"] == pid]
        assert output_ids in sent  # the ids in the Completion are what a server returned
    assert stats["failovers"] >= 1 and stats["servers_up"] == 2
    assert answers[victim_port] and sum(survivors.values()) + len(answers[victim_port]) >= prompts


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({"type": "length", "length": 40}, ("length", None)),
        ({"type": "stop", "matched": IM_END}, ("stop", IM_END)),
        ({"type": "abort", "message": "x"}, ("abort", None)),
        ("length", ("length", None)),
        (None, ("stop", None)),
    ],
)
def test_normalize_finish(raw: object, want: tuple[str, object]) -> None:
    assert normalize_finish(raw) == want


@pytest.mark.parametrize(
    ("ids", "thinking", "truncated", "want"),  # 5000 is " difficult": only the format's "\n" is stripped
    [
        ([THINK_START, 5000, THINK_END, 271, 6000], True, False, (" difficult", "ViewById", 3)),
        ([5000, THINK_END, 6000], True, False, (" difficult", "ViewById", 2)),  # <think> was in the prompt
        ([THINK_START, 5000], True, True, (" difficult", "", 2)),  # cut off while thinking
        ([5000], True, True, (" difficult", "", 1)),
        ([THINK_END, 6000], True, False, ("", "ViewById", 1)),  # the prompt opened the block, closed at once
        ([6000], False, True, ("", "ViewById", 0)),
        ([6000], True, False, ("", "ViewById", 0)),  # chose not to think
    ],
)
def test_split_reasoning(ids: list[int], thinking: bool, truncated: bool, want: tuple[str, str, int]) -> None:
    codec = qwen_codec()
    assert split_ids(ids, codec.markers, codec.decode, cut_while_thinking=thinking and truncated) == want


@pytest.mark.parametrize(
    ("served", "ok"),
    [
        ("Qwen/Qwen3-8B", True),
        ("/models/Qwen3-8B", True),
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/abc123", True),
        ("/data/Qwen/Qwen3-8B/", True),
        ("Qwen/Qwen3-4B", False),
        ("/models/Llama-3.1-8B", False),
    ],
)
def test_model_matches(served: str, ok: bool) -> None:
    assert model_matches(served, MODEL) is ok


def test_config_is_the_output_settings_only() -> None:
    a = engine(["http://127.0.0.1:1"]).config()
    b = engine(["http://127.0.0.1:2", "http://127.0.0.1:3"], max_in_flight_per_server=9).config()
    assert a == b and a["model"] == MODEL and a["max_new_tokens"] == 40
    assert engine(["http://127.0.0.1:1"], thinking=False).config() != a


def test_the_timeout_bounds_the_whole_request_even_when_the_server_drips_bytes() -> None:
    """#20: an answer sent one byte at a time never idles a read for long, yet must not outlast the timeout."""

    async def run() -> tuple[type[BaseException], float]:
        async with fake_server(drip_s=0.02) as (url, _fake):  # a ~300-byte answer takes ~6 s
            eng = engine([url], timeout_s=1, reprobe_s=3600)
            started = time.monotonic()
            try:
                await eng.complete(conversation(0), prompt_id="p0")
            except RetryableError as exc:
                return type(exc), time.monotonic() - started
            finally:
                await eng.aclose()
        return type(None), 0.0

    kind, took = asyncio.run(run())
    assert kind is RetryableError and took < 5  # the 1-s timeout, not the answer's 6 s, with room for a loaded box
