"""The `local` kind's fast path: SGLang's offline engine where `sglang` imports and a GPU is there.

No GPU is lent to these tests: `sglang` is a stand-in module whose `Engine` answers as SGLang's does
(`async_generate` -> `output_ids` + `meta_info`, ids from the SGLang stand-in server's reply rule) and
insists on being awaited on the loop it was built on, as SGLang's tokenizer manager is.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from eagle_data.catalog import Generation
from eagle_data.engines import make_engine
from eagle_data.engines.local import LocalEngine
from eagle_data.engines.local_sglang import PROVIDER, SGLangLocalEngine, _started, _tokenizer
from eagle_data.standins.sglang_fake import reply_ids

GEN = Generation(max_tokens=40, min_tokens=8, temperature=0.8, top_p=0.95, thinking=False)
CHAT = [{"role": "user", "content": "Write a haiku about compilers."}]


class FakeEngine:
    """sglang.Engine's offline API, as far as the fast path uses it."""

    built: ClassVar[list[FakeEngine]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.loop = kwargs, asyncio.get_event_loop()
        self.requests: list[dict[str, Any]] = []
        self.running = self.max_running = 0
        FakeEngine.built.append(self)

    async def async_generate(self, *, input_ids: list[int], sampling_params: dict[str, Any], rid: str) -> dict:
        assert asyncio.get_running_loop() is self.loop, "SGLang requests must run on the engine's own loop"
        self.requests.append({"input_ids": input_ids, "sampling_params": sampling_params, "rid": rid})
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(0.05)
        finally:
            self.running -= 1
        ids, finish = reply_ids(7, input_ids, sampling_params["max_new_tokens"])
        return {"output_ids": ids, "meta_info": {"id": rid, "finish_reason": finish, "prompt_tokens": len(input_ids),
                                                 "completion_tokens": len(ids)}}  # fmt: skip


@pytest.fixture
def gpu_box(monkeypatch: pytest.MonkeyPatch) -> type[FakeEngine]:
    """A machine where `sglang` imports and torch sees a GPU."""
    import torch

    module = types.ModuleType("sglang")
    module.__spec__ = importlib.machinery.ModuleSpec("sglang", None)
    module.Engine = FakeEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    FakeEngine.built = []
    _started.cache_clear()
    yield FakeEngine
    _started.cache_clear()


def local(demo_model: Path) -> Any:
    return make_engine("local", model=str(demo_model), **GEN.model_dump())


def test_the_local_kind_runs_sglangs_offline_engine_on_a_gpu_box(gpu_box: type[FakeEngine], demo_model: Path):
    engine = local(demo_model)
    assert isinstance(engine, SGLangLocalEngine) and PROVIDER in engine.describe()
    assert "SGLang's offline engine" in asyncio.run(engine.check())
    done = asyncio.run(engine.complete(CHAT, prompt_id="p1"))
    (sglang,) = gpu_box.built
    assert sglang.kwargs["model_path"] == str(demo_model.resolve()) and sglang.kwargs["skip_tokenizer_init"]
    (request,) = sglang.requests
    tokenizer = _tokenizer(demo_model.resolve())
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=False, return_dict=True)
    assert request["input_ids"] == prompt["input_ids"]  # the checkpoint's own template
    assert request["sampling_params"] == {  # the transformers path's top-k (the checkpoint sets none: 50)
        "max_new_tokens": 40, "min_new_tokens": 8, "temperature": 0.8, "top_p": 0.95, "top_k": 50
    }
    ids, _ = reply_ids(7, request["input_ids"], 40)
    assert done.output_ids == ids and done.provider == PROVIDER  # SGLang's own tokens, kept as they came
    stopped = ids[-1] == tokenizer.eos_token_id
    assert done.finish_reason == ("stop" if stopped else "length")
    assert done.content == tokenizer.decode(ids[:-1] if stopped else ids).lstrip("\n")
    assert engine.config() == LocalEngine(demo_model, GEN).config()  # the same request as the transformers path's


def test_what_is_in_flight_goes_to_one_engine_together_across_runs(gpu_box: type[FakeEngine], demo_model: Path):
    """SGLang batches what is in flight; the runner opens a new event loop per run."""
    engine = local(demo_model)

    async def run(n: int) -> list[Any]:
        return await asyncio.gather(*(engine.complete(CHAT, prompt_id=f"p{i}") for i in range(n)))

    first, second = asyncio.run(run(6)), asyncio.run(run(2))
    (sglang,) = gpu_box.built  # loaded once per process
    assert sglang.max_running == 6 and len(sglang.requests) == 8 and all(d.output_ids for d in first + second)


def test_without_a_gpu_or_without_sglang_the_transformers_path_runs(
    gpu_box: type[FakeEngine], demo_model: Path, monkeypatch: pytest.MonkeyPatch
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert type(local(demo_model)) is LocalEngine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "sglang", None)  # `import sglang` raises ImportError
    assert type(local(demo_model)) is LocalEngine
    assert not gpu_box.built
