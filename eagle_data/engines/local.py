"""The embedded default engine: a transformers checkpoint generating in-process (CPU or GPU).

Needs no key, server or network. Requests are queued onto one worker thread (torch already uses every
core), each seeded from its prompt so a re-run reproduces the same text. It returns the model's own
output ids, so training ids need no re-tokenization. The demo model is so small that torch's threads
only wait on each other: it generates on one thread (the same tokens for a third of the CPU or less).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle_data.catalog import Generation
from eagle_data.engines import EngineKind, EngineSettings, register
from eagle_data.engines.replies import split_ids
from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers, reasoning_markers
from eagle_data.types import Completion, ConfigError, Engine, Message, Sampling, SamplingRefused

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec

DEMO_NOTE = "the demo model"
# One generation at a time in this process, whichever engine asks: engines share a loaded checkpoint, and
# torch's random generator, seeded per prompt, is the process's. Requests wait for it on this one thread, not
# in asyncio's shared pool, where queued generations would starve the runner's storage calls (lease renewals).
_GENERATING = threading.Lock()
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-engine")


class LocalEngine(Engine):
    """In-process generation with `transformers` (extra `local`: torch)."""

    name = "local"
    reports_prompt_ids = True  # it renders the prompt itself: the pre-flight compares it with the target's

    def __init__(
        self,
        model_path: str | Path,
        generation: Generation,
        *,
        device: str = "cpu",
        demo: bool = False,
        markers: ReasoningMarkers | None = THINK_TAGS,
    ) -> None:
        """`markers`: the target's think-block markers (None: its format has none)."""
        self.model_path = Path(model_path).expanduser().resolve()
        if not (self.model_path / "config.json").is_file():
            raise ConfigError(
                f"local engine: no checkpoint at {self.model_path}; run `eagle-data demo-model` to build the demo "
                "checkpoint, or set EAGLE_DATA_MODEL to a transformers model folder"
            )
        self.model = str(self.model_path)  # rows name the checkpoint: `target = "auto"` derives the target from it
        self.generation = generation
        self.device, self.demo, self.markers = device, demo, markers

    def config(self) -> dict[str, Any]:
        """The resolved checkpoint path, not its folder name: `/runs/a/final` and `/runs/b/final` are two models."""
        return {"engine": self.name, "model": str(self.model_path), **self.generation.model_dump()}

    def _load(self) -> tuple[Any, Any]:
        return _checkpoint(self.model_path, self.device, _fingerprint(self.model_path))

    def _generate(self, messages: list[Message], prompt_id: str) -> Completion:
        import torch

        with _GENERATING, _torch_threads(1 if self.demo else None):
            tokenizer, model = self._load()
            prompt = tokenizer.apply_chat_template(
                [{"role": m["role"], "content": m["content"]} for m in messages],
                add_generation_prompt=True,
                enable_thinking=self.generation.thinking,
                return_dict=True,
                return_tensors="pt",
            ).to(self.device)
            turn = sum(m["role"] == "user" for m in messages)
            torch.manual_seed(int(hashlib.sha256(f"{prompt_id}:{turn}".encode()).hexdigest()[:8], 16))
            g = self.generation
            with torch.no_grad():
                out = model.generate(
                    **prompt,
                    max_new_tokens=g.max_tokens,
                    min_new_tokens=min(g.min_tokens, g.max_tokens),
                    do_sample=g.temperature > 0,
                    temperature=g.temperature or None,
                    top_p=g.top_p,
                    pad_token_id=tokenizer.pad_token_id,
                )
        prompt_ids = prompt["input_ids"][0].tolist()
        output_ids = out[0, len(prompt_ids) :].tolist()
        return _to_completion(tokenizer, output_ids, prompt_ids, self.markers)

    def _render(self, messages: list[Message]) -> list[int]:
        tokenizer, _ = self._load()
        return tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            add_generation_prompt=True, enable_thinking=self.generation.thinking, return_dict=True,
        )["input_ids"]  # fmt: skip

    async def served_prompt_ids(self, messages: list[Message]) -> list[int]:
        """The prompt ids this checkpoint's own chat template gives `messages` (what `complete` generates from)."""
        return await asyncio.to_thread(self._render, messages)

    def describe(self) -> str:
        return f"{self.name} ({DEMO_NOTE})" if self.demo else f"{self.name} {self.model_path}"

    async def check(self) -> str:
        await asyncio.to_thread(self._load)
        if self.demo:
            return (f"local engine: {DEMO_NOTE} at {self.model_path} on {self.device}; "
                    "real runs set EAGLE_DATA_ENGINE to a served model")  # fmt: skip
        return f"local engine: {self.model_path} on {self.device}"

    async def complete(
        self, messages: list[Message], *, prompt_id: str, sampling: Sampling | None = None
    ) -> Completion:
        if sampling is not None:
            raise SamplingRefused(self.name)
        return await asyncio.get_running_loop().run_in_executor(_WORKER, self._generate, messages, prompt_id)

    async def aclose(self) -> None:
        """Nothing to release per run: the model stays loaded for the next run in this process (`_checkpoint`)."""


@functools.lru_cache(maxsize=1)
def _checkpoint(path: Path, device: str, fingerprint: tuple[tuple[str, int, int], ...]) -> tuple[Any, Any]:
    """The tokenizer and model of a checkpoint, loaded once per process: each run builds its own engine, and
    a load costs seconds. `fingerprint` (its files' names, sizes and times) makes a checkpoint rewritten in
    place load again."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    return tokenizer, model


def _fingerprint(path: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file()))


@contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `count` for this block (None: left as it is), then restored."""
    import torch

    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _to_completion(
    tokenizer: Any, output_ids: list[int], prompt_ids: list[int], markers: ReasoningMarkers | None = THINK_TAGS
) -> Completion:
    """Split the model's tokens into reasoning and content at the think-block markers (their ids in the
    checkpoint's own vocabulary); the end-of-turn id stays in output_ids."""
    eos = tokenizer.eos_token_id
    stopped = bool(output_ids) and output_ids[-1] == eos
    body = output_ids[:-1] if stopped else output_ids
    if markers is not None:
        ids = tokenizer.convert_tokens_to_ids([markers.open_text, markers.close_text])
        markers = replace(markers, open_id=ids[0], close_id=ids[1])
    reasoning, content, reasoning_tokens = split_ids(body, markers, tokenizer.decode, cut_while_thinking=False)
    return Completion(
        content=content,
        reasoning=reasoning,
        reasoning_tokens=reasoning_tokens,
        finish_reason="stop" if stopped else "length",
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(output_ids),
        output_ids=output_ids,
        prompt_ids=prompt_ids,
        provider="local",
    )


def make_local(
    *, model: str, device: str = "cpu", markers: ReasoningMarkers | None = THINK_TAGS, **generation: Any
) -> Engine:
    """A local engine from keyword arguments: a checkpoint folder and the catalog's generation fields. The
    demo checkpoint's folder (which only the demo profile fills in) is built on first use and reported as such.
    On a GPU machine with `sglang` installed it is SGLang's offline engine (`local_sglang`), else transformers."""
    from eagle_data.demo import demo_model_path, ensure_demo_model
    from eagle_data.engines.local_sglang import SGLangLocalEngine, sglang_serves

    sampling = Generation(**{k: v for k, v in generation.items() if k in Generation.model_fields})
    path = Path(model).expanduser().resolve()
    demo = path == demo_model_path().resolve()
    checkpoint = ensure_demo_model(path) if demo else path
    engine = LocalEngine(checkpoint, sampling, device=device, demo=demo, markers=markers)  # checks the folder
    if sglang_serves():
        return SGLangLocalEngine(engine.model_path, sampling, demo=demo, markers=markers)
    return engine


def _build(settings: EngineSettings, spec: DatasetSpec) -> Engine:
    return make_local(model=settings.model, markers=reasoning_markers(spec.target), **spec.generation.model_dump())


register(EngineKind(
    name="local", build=_build, make=make_local, summary="a transformers checkpoint in this process",
    required={"model": "set EAGLE_DATA_MODEL to a transformers checkpoint folder "
                       "(or EAGLE_DATA_PROFILE=demo for the demo model, SmolLM2-135M-Instruct)"},
    max_in_flight=4, ramp=False, demo=True,  # one model in this process: a short queue keeps the log honest
    billing="free",
))  # fmt: skip
