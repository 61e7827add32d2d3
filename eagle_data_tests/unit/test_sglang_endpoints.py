"""SGLang's introspection endpoints as 0.5.23 serves them: `/server_info` and `/model_info` asked first, the
deprecated `/get_server_info` and `/get_model_info` only for an SGLang from before the rename."""

from __future__ import annotations

import asyncio

import pytest

from eagle_data.engines import make_engine
from eagle_data.engines.served import ModelMismatchError
from eagle_data.engines.sglang import SGLangEngine
from eagle_data_tests.unit.test_sglang import MODEL, conversation, fake_server

DEPRECATED = {"/get_server_info", "/get_model_info"}


def engine(urls: list[str]) -> SGLangEngine:
    """The chat path: what is probed is the same, and it needs no target tokenizer."""
    return make_engine("sglang", urls=tuple(urls), model=MODEL, mode="chat")


def probe(**fake: object) -> tuple[dict[str, int], dict[str, object], str]:
    """Start one stand-in, probe it through the engine and send one prompt: (paths asked, stats, reply)."""

    async def run() -> tuple[dict[str, int], dict[str, object], str]:
        async with fake_server(**fake) as (url, server):
            eng = engine([url])
            try:
                await eng.check()
                done = await eng.complete(conversation(0), prompt_id="p0")
                return dict(server.hits), eng.stats(), done.content
            finally:
                await eng.aclose()

    return asyncio.run(run())


def test_the_probe_asks_the_current_endpoints_and_never_the_deprecated_ones() -> None:
    hits, _, ids = probe(api="0.5.23")
    assert hits.keys() >= {"/health", "/server_info", "/model_info"} and not hits.keys() & DEPRECATED
    assert ids


def test_a_server_that_removed_the_deprecated_endpoints_is_served() -> None:
    hits, stats, ids = probe(api="next")
    assert stats["servers_up"] == 1 and ids and "/model_info" in hits


def test_an_sglang_from_before_the_rename_is_read_through_the_deprecated_endpoints() -> None:
    hits, stats, ids = probe(api="old")
    assert stats["servers_up"] == 1 and ids and hits.keys() >= DEPRECATED


def test_the_served_model_name_counts_as_the_model_a_server_serves() -> None:
    """A server loading a local checkpoint folder under `--served-model-name` serves the target."""
    _, stats, _ = probe(model="/data/checkpoints/final", served_model_name=MODEL)
    assert stats["servers_up"] == 1
    with pytest.raises(ModelMismatchError) as err:
        probe(model="/data/checkpoints/final", served_model_name="another-model")
    assert "/data/checkpoints/final" in str(err.value) and MODEL in str(err.value)


def test_the_cap_is_twice_the_max_running_requests_of_server_info() -> None:
    async def run() -> int:
        async with fake_server(max_running_requests=3, delay_s=0.1) as (url, server):
            eng = engine([url])
            try:
                await asyncio.gather(*(eng.complete(conversation(i), prompt_id=f"p{i}") for i in range(12)))
            finally:
                await eng.aclose()
            return server.max_running

    assert asyncio.run(run()) == 6
