"""The embedded default engine: a transformers checkpoint generating in-process (CPU or GPU).

Needs no key, server or network. One worker thread per process generates for every local engine: the requests
that arrive while it is busy wait and go into its next batch (left-padded, with an attention mask), up to the
engine's batch size, since a batch of 16 makes about ten times the tokens per CPU-second of one prompt at a
time (docs/engines.md, "The local engine"). Each row keeps what one request alone would get: its own min/max
tokens, temperature and top-p, drawn from its own generator seeded from its prompt, so a re-run reproduces the
same text whatever batch it lands in. It returns the model's own output ids, so training ids need no
re-tokenization. torch's thread count follows the CPUs other processes leave free (engines/cpus.py), unless
the `threads` setting names one. Where the catalog asks (`[defaults.on_policy] sampled_logprobs`), each reply
carries its tokens' log-probabilities and ranks, read from the logits it was sampled from (engines/batched.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle_data.catalog import Generation
from eagle_data.engines import EngineKind, EngineSettings, register
from eagle_data.engines.batched import Row, checkpoint_top_k, generate_rows
from eagle_data.engines.cpus import retune, torch_threads
from eagle_data.engines.replies import completion_from_ids
from eagle_data.quality.sampled import asked_top_logprobs
from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers, reasoning_markers
from eagle_data.types import Completion, ConfigError, Engine, Message, Sampling, SamplingRefused

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec

DEMO_NOTE = "the demo model"
BATCH_SIZE = 16  # prompts generated together: SmolLM2-135M on one thread, 8: 51 tokens/s, 16: 70, 32: 83
GATHER_S = 0.5  # a batch waits for more requests while they keep arriving at most this far apart: at 0.05 s a
# busy machine's stalls split the demo's 12 prompts into batches of 7 and 5, one batch's steps twice over
# One generation at a time in this process, whichever engine asks: engines share a loaded checkpoint and
# torch's thread count is the process's.
_GENERATING = threading.Lock()
_LOADING = threading.Lock()  # requests of a new run all ask at once: one load


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
        batch_size: int = BATCH_SIZE,
        threads: int | None = None,
        top_logprobs: int = 0,
    ) -> None:
        """`markers`: the target's think-block markers (None: its format has none); `batch_size`: the most
        prompts generated together; `threads`: torch's thread count (None: the CPUs others leave free);
        `top_logprobs` > 0: each reply carries its tokens' log-probabilities, their ranks capped at that k - 1
        (left out of `config()`: they change no reply)."""
        self.model_path = Path(model_path).expanduser().resolve()
        if not (self.model_path / "config.json").is_file():
            raise ConfigError(
                f"local engine: no checkpoint at {self.model_path}; run `eagle-data demo-model` to build the demo "
                "checkpoint, or set EAGLE_DATA_MODEL to a transformers model folder"
            )
        self.model = str(self.model_path)  # rows name the checkpoint: `target = "auto"` derives the target from it
        self.generation = generation
        self.device, self.demo, self.markers = device, demo, markers
        self.batch_size, self.threads, self.top_logprobs = batch_size, threads, top_logprobs
        self.batches = self.rows = self.threads_used = 0  # this engine's share of the worker's work

    def config(self) -> dict[str, Any]:
        """The resolved checkpoint path, not its folder name: `/runs/a/final` and `/runs/b/final` are two models;
        the top-k a sampled row is cut to (the on-policy scorer predicts the same distribution from it). No batch
        size or thread count: a row's tokens do not depend on them."""
        return {"engine": self.name, "model": str(self.model_path), "top_k": checkpoint_top_k(self.model_path),
                **self.generation.model_dump()}  # fmt: skip

    def _load(self) -> tuple[Any, Any]:
        with _LOADING:
            return _checkpoint(self.model_path, self.device, _fingerprint(self.model_path))

    def _render(self, messages: list[Message]) -> list[int]:
        tokenizer, _ = self._load()
        return list(tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            add_generation_prompt=True, enable_thinking=self.generation.thinking, return_dict=True,
        )["input_ids"])  # fmt: skip

    async def served_prompt_ids(self, messages: list[Message]) -> list[int]:
        """The prompt ids this checkpoint's own chat template gives `messages` (what `complete` generates from)."""
        return await asyncio.to_thread(self._render, messages)

    def _request(self, messages: list[Message], prompt_id: str) -> Row:
        """One request as a batch row: the checkpoint's own chat template renders it; its seed is its prompt's
        and turn's."""
        import torch

        turn = sum(m["role"] == "user" for m in messages)
        seed = int(hashlib.sha256(f"{prompt_id}:{turn}".encode()).hexdigest()[:8], 16)
        g = self.generation
        return Row(
            self._render(messages), g.max_tokens, min(g.min_tokens, g.max_tokens), g.temperature, g.top_p,
            torch.Generator(self.device).manual_seed(seed), self.top_logprobs,
        )  # fmt: skip

    def describe(self) -> str:
        return f"{self.name} ({DEMO_NOTE})" if self.demo else f"{self.name} {self.model_path}"

    def stats(self) -> dict[str, Any]:
        """How many batches this engine's requests went in, how full, on how many torch threads (the last)."""
        if not self.batches:
            return {}
        return {"batches": self.batches, "rows_per_batch": round(self.rows / self.batches, 1),
                "torch_threads": self.threads_used}  # fmt: skip

    def stats_line(self) -> str:
        if not (stats := self.stats()):
            return ""
        return f"batches of {stats['rows_per_batch']:g} on {stats['torch_threads']} thread(s)"

    async def check(self) -> str:
        await asyncio.to_thread(self._load)
        threads = f"{self.threads} torch threads (set)" if self.threads else "torch threads: the CPUs others leave free"
        how = f"on {self.device}, batches of up to {self.batch_size}, {threads}"
        if self.demo:
            return (f"local engine: {DEMO_NOTE} at {self.model_path} {how}; "
                    "real runs set EAGLE_DATA_ENGINE to a served model")  # fmt: skip
        return f"local engine: {self.model_path} {how}"

    async def complete(
        self, messages: list[Message], *, prompt_id: str, sampling: Sampling | None = None
    ) -> Completion:
        """Queued for the process's worker; a request cancelled before its batch starts is never generated."""
        if sampling is not None:
            raise SamplingRefused(self.name)
        return await asyncio.wrap_future(_batcher().submit(self, messages, prompt_id))

    async def aclose(self) -> None:
        """Nothing to release per run: the model stays loaded for the next run in this process (`_checkpoint`)."""


@dataclass(eq=False)
class _Ask:
    """A request waiting for the worker."""

    engine: LocalEngine
    messages: list[Message]
    prompt_id: str
    future: concurrent.futures.Future[Completion] = field(default_factory=concurrent.futures.Future)

    @property
    def key(self) -> tuple[Path, str]:
        """Requests batch together when they ask the same checkpoint on the same device."""
        return self.engine.model_path, self.engine.device


class _Batcher:
    """The process's one generating thread: it takes the oldest waiting request and every other one for the
    same checkpoint, up to that engine's batch size, waiting a moment while more keep arriving. Requests wait in
    its own list, never in asyncio's shared pool, where queued generations would starve the runner's storage
    calls (lease renewals)."""

    def __init__(self) -> None:
        self._waiting: list[_Ask] = []
        self._arrived = threading.Condition()
        threading.Thread(target=self._serve, name="local-engine", daemon=True).start()

    def submit(self, engine: LocalEngine, messages: list[Message], prompt_id: str) -> concurrent.futures.Future:
        ask = _Ask(engine, messages, prompt_id)
        with self._arrived:
            self._waiting.append(ask)
            self._arrived.notify()
        return ask.future

    def _next_batch(self) -> list[_Ask]:
        with self._arrived:
            while not self._waiting:
                self._arrived.wait()
            first = self._waiting[0]
            while True:
                same = [ask for ask in self._waiting if ask.key == first.key][: first.engine.batch_size]
                seen = len(self._waiting)
                if len(same) == first.engine.batch_size:
                    break
                self._arrived.wait(GATHER_S)
                if len(self._waiting) == seen:
                    break
            self._waiting = [ask for ask in self._waiting if ask not in same]
        return [ask for ask in same if ask.future.set_running_or_notify_cancel()]

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            rows: list[tuple[_Ask, Row]] = []
            for ask in batch:
                try:
                    rows.append((ask, ask.engine._request(ask.messages, ask.prompt_id)))
                except Exception as exc:  # this prompt cannot be rendered: it fails alone
                    ask.future.set_exception(exc)
            if rows:
                self._answer(rows)

    def _answer(self, rows: list[tuple[_Ask, Row]]) -> None:
        """Generate the batch; when it fails, each row alone, so one bad prompt fails only itself."""
        import torch

        engine = rows[0][0].engine
        try:
            tokenizer, model = engine._load()
            with _GENERATING, torch_threads(engine.threads):
                outputs = generate_rows(model, tokenizer, [row for _, row in rows], None if engine.threads else retune)
                threads = torch.get_num_threads()  # the count it ended on: `retune` may change it at every step
        except Exception as exc:
            if len(rows) > 1:
                for one in rows:
                    self._answer([one])
                return
            rows[0][0].future.set_exception(exc)
            return
        for asker in {ask.engine for ask, _ in rows}:
            asker.batches += 1
            asker.rows += sum(ask.engine is asker for ask, _ in rows)
            asker.threads_used = threads
        for (ask, row), (ids, figures) in zip(rows, outputs, strict=True):
            try:
                done = completion_from_ids(tokenizer, ids, row.prompt, ask.engine.markers, "local")
                done = replace(done, sampled_logprobs=figures)
            except Exception as exc:  # this reply cannot be read: it fails alone, the worker goes on
                ask.future.set_exception(exc)
            else:
                ask.future.set_result(done)


_BATCHER: tuple[int, _Batcher] | None = None
_STARTING = threading.Lock()


def _batcher() -> _Batcher:
    """This process's worker (a forked child starts its own: threads do not survive a fork)."""
    global _BATCHER
    with _STARTING:
        if _BATCHER is None or _BATCHER[0] != os.getpid():
            _BATCHER = (os.getpid(), _Batcher())
        return _BATCHER[1]


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


def make_local(
    *,
    model: str,
    device: str = "cpu",
    markers: ReasoningMarkers | None = THINK_TAGS,
    batch_size: int = BATCH_SIZE,
    threads: int | None = None,
    top_logprobs: int = 0,
    **generation: Any,
) -> Engine:
    """A local engine from keyword arguments: a checkpoint folder and the catalog's generation fields. The
    demo checkpoint's folder (which only the demo profile fills in) is built on first use and reported as such.
    On a GPU machine with `sglang` installed it is SGLang's offline engine (`local_sglang`, which batches on
    its own, and reports no `top_logprobs` figures), else transformers."""
    from eagle_data.demo import demo_model_path, ensure_demo_model
    from eagle_data.engines.local_sglang import SGLangLocalEngine, sglang_serves

    sampling = Generation(**{k: v for k, v in generation.items() if k in Generation.model_fields})
    path = Path(model).expanduser().resolve()
    demo = path == demo_model_path().resolve()
    checkpoint = ensure_demo_model(path) if demo else path
    engine = LocalEngine(
        checkpoint, sampling, device=device, demo=demo, markers=markers, batch_size=batch_size, threads=threads,
        top_logprobs=top_logprobs,
    )  # checks the folder
    if sglang_serves():
        return SGLangLocalEngine(engine.model_path, sampling, note=DEMO_NOTE if demo else "", markers=markers)
    return engine


def _build(settings: EngineSettings, spec: DatasetSpec) -> Engine:
    return make_local(
        model=settings.model, markers=reasoning_markers(spec.target), batch_size=settings.batch_size or BATCH_SIZE,
        threads=settings.threads, top_logprobs=asked_top_logprobs(spec.on_policy), **spec.generation.model_dump(),
    )  # fmt: skip


register(EngineKind(
    name="local", build=_build, make=make_local, summary="a transformers checkpoint in this process",
    required={"model": "set EAGLE_DATA_MODEL to a transformers checkpoint folder "
                       "(or EAGLE_DATA_PROFILE=demo for the demo model, SmolLM2-135M-Instruct)"},
    takes=frozenset({"batch_size", "threads"}),
    max_in_flight=2 * BATCH_SIZE, ramp=False, demo=True,  # one batch generating, the next one gathering
    billing="free",
))  # fmt: skip
