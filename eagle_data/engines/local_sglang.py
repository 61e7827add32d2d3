"""The `local` kind's fast path on a GPU machine: SGLang's offline engine (`sglang.Engine`) in this process.

`make_local` picks it only when torch sees a CUDA GPU and `sglang` imports (the `gpu` extra); everywhere
else the transformers path runs, unchanged. Same protocol, same rows: the checkpoint's own chat template
renders the prompt ids, SGLang returns the model's own output ids (`skip_tokenizer_init`: it never
detokenizes), and `replies.completion_from_ids` splits them, as for the transformers path. SGLang batches
whatever is in flight, so a GPU run raises EAGLE_DATA_MAX_IN_FLIGHT (the kind's default suits the CPU path).
`make_local` (engines/local.py) chooses this path; nothing here imports it back.

SGLang binds its request handling to the event loop it starts on, and the runner opens a new loop per run:
the engine lives on a thread of its own with its own loop, loaded once per process, and each request is
handed to that loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.util
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_data.catalog import Generation
from eagle_data.engines.batched import checkpoint_top_k
from eagle_data.engines.replies import completion_from_ids
from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers
from eagle_data.types import Completion, Engine, Message, Sampling, SamplingRefused

PROVIDER = "sglang-offline"  # the rows' `provider`: which path of the local kind made them


def sglang_serves() -> bool:
    """Whether this machine takes the fast path: torch sees a CUDA GPU and `sglang` imports. Where sglang is
    not installed (every CPU machine) it costs one look at the import path, no torch import."""
    if importlib.util.find_spec("sglang") is None:
        return False
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class _Runtime:
    """A loaded `sglang.Engine`, the loop its requests run on, and the checkpoint's tokenizer."""

    engine: Any
    loop: asyncio.AbstractEventLoop
    tokenizer: Any


_STARTING = threading.Lock()  # the first requests of a run all ask at once: one engine is started


def _runtime(path: Path) -> _Runtime:
    with _STARTING:
        return _started(path)


@functools.lru_cache(maxsize=1)
def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.lru_cache(maxsize=1)
def _started(path: Path) -> _Runtime:
    """Start SGLang's offline engine on its own thread and loop (once per process: loading takes minutes)."""
    import sglang

    started: concurrent.futures.Future[_Runtime] = concurrent.futures.Future()

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # sglang.Engine takes the thread's loop as its own
        try:
            engine = sglang.Engine(model_path=str(path), skip_tokenizer_init=True, log_level="error")
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(_Runtime(engine, loop, _tokenizer(path)))
        loop.run_forever()

    threading.Thread(target=serve, name="sglang-offline", daemon=True).start()
    return started.result()


class SGLangLocalEngine(Engine):
    """eagle_data.types.Engine over `sglang.Engine.async_generate` (input ids in, output ids out). It reports no
    sampled tokens' log-probabilities (`[defaults.on_policy] sampled_logprobs`): its rows carry none."""

    name = "local"

    def __init__(
        self,
        model_path: Path,
        generation: Generation,
        *,
        note: str = "",
        markers: ReasoningMarkers | None = THINK_TAGS,
    ) -> None:
        """`note`: what the checkpoint is when it is not what the user named (the demo model), else ""."""
        self.model_path, self.generation, self.note, self.markers = model_path, generation, note, markers
        self.model = str(model_path)

    def config(self) -> dict[str, Any]:
        """The transformers path's: the same checkpoint and sampling (its top-k too) ask for the same replies."""
        return {"engine": self.name, "model": str(self.model_path), "top_k": checkpoint_top_k(self.model_path),
                **self.generation.model_dump()}  # fmt: skip

    def describe(self) -> str:
        return f"{self.name} ({self.note}, {PROVIDER})" if self.note else f"{self.name} {self.model_path} ({PROVIDER})"

    async def check(self) -> str:
        await asyncio.to_thread(_runtime, self.model_path)
        note = f" ({self.note})" if self.note else ""
        return f"local engine: {self.model_path}{note} in SGLang's offline engine on the GPU"

    async def complete(
        self, messages: list[Message], *, prompt_id: str, sampling: Sampling | None = None
    ) -> Completion:
        if sampling is not None:
            raise SamplingRefused(self.name)
        runtime = await asyncio.to_thread(_runtime, self.model_path)
        g = self.generation
        prompt = runtime.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            add_generation_prompt=True,
            enable_thinking=g.thinking,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        top_k = checkpoint_top_k(self.model_path) or -1  # the transformers path's cut (SGLang's "none" is -1)
        params = {"max_new_tokens": g.max_tokens, "min_new_tokens": min(g.min_tokens, g.max_tokens),
                  "temperature": g.temperature, "top_p": g.top_p, "top_k": top_k}  # fmt: skip
        request = runtime.engine.async_generate(
            input_ids=list(prompt), sampling_params=params, rid=f"{prompt_id}-{uuid.uuid4().hex[:8]}"
        )
        out = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(request, runtime.loop))
        ids = [int(i) for i in out["output_ids"]]
        return completion_from_ids(runtime.tokenizer, ids, list(prompt), self.markers, PROVIDER)

    async def aclose(self) -> None:
        """Nothing per run: the engine stays loaded for the next run in this process (`_runtime`)."""
