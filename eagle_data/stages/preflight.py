"""What estimate and generation check before the first paid request: a price for a dollar budget, a writable
output root, the target's tokenizer, the benchmark files, and the server's chat template."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping

import polars as pl

from eagle_data import engines, layout
from eagle_data.catalog import CatalogError, DatasetSpec
from eagle_data.drafter.settings import load_drafter_settings
from eagle_data.quality.evalsets import BenchmarkError, load_items
from eagle_data.quality.verdicts import PROMPT_MISMATCH
from eagle_data.report import Log
from eagle_data.runner.prices import refuse_unpriced
from eagle_data.runner.resultlog import resume_key
from eagle_data.runner.rows import plan_turns
from eagle_data.storage import ShardStore, StorageError
from eagle_data.targets import TargetError, load_target, prompt_difference, resolve_target
from eagle_data.types import Engine, EngineError, RetryableError, UserError


class PreflightError(UserError, RuntimeError):
    """Something a later stage needs is missing, found before the first paid request; the message says what."""


def preflight(spec: DatasetSpec, store: ShardStore, model: str, engine_kind: str = "") -> None:
    """Check, before the first paid request, that a dollar budget has a price to count with (`engine_kind`'s
    billing), and what the stages after generation need: the output root takes a write, the target's
    tokenizer loads (with `target = "auto"`, the one `model` maps to), every configured benchmark file reads (its
    items only: the n-gram index is built where it is used, at validation).
    Each failure is one line; found at validation, it would come after the replies were paid for."""
    kind = engines.kinds().get(engine_kind)
    refuse_unpriced(spec.name, spec.cost_budget_usd, kind.billing if kind else "unknown", model)
    probe = layout.write_check(spec.name, f"{os.getpid()}-{time.time_ns()}")
    try:
        store.write_bytes(probe, b"")
        store.delete(probe)
        load_target(resolve_target(spec.target, [model]))
        load_items(load_drafter_settings().decontamination)  # every file reads; the index is validation's
    except (StorageError, TargetError, BenchmarkError, CatalogError) as exc:
        raise PreflightError(f"{spec.name}: before any request: {exc}") from None


def check_server_template(spec: DatasetSpec, engine: Engine, prompts: Mapping[str, pl.DataFrame], log: Log) -> None:
    """For an engine that reports the prompt ids its server rendered: send the dataset's first request (for a
    one-token reply) and stop before any other when the server renders it otherwise than the target profile,
    which would make every row a paid-for `prompt_mismatch`. `check_server_template = false` forces past it."""
    if not engine.reports_prompt_ids:
        return
    if not spec.check_server_template:
        log(f"WARNING {spec.name}: the server's chat template is not checked (check_server_template = false); "
            f"rows it renders otherwise than target {spec.target} are set aside at validation as {PROMPT_MISMATCH} "
            "(the blocking token_structure check)")  # fmt: skip
        return
    first = next((frame["messages"].head(1).to_list()[0] for frame in prompts.values() if frame.height), [])
    segments = plan_turns(first, spec.regenerate, spec.max_turns)
    if not segments:
        return
    target = load_target(resolve_target(spec.target, [engine.model]))

    async def served() -> list[int]:
        try:
            await engine.check()
            return await engine.served_prompt_ids(segments[0])
        finally:
            await engine.aclose()

    try:
        difference = prompt_difference(target, segments[0], asyncio.run(served()), thinking=spec.generation.thinking)
    except EngineError as exc:  # a passing failure (a 503, a reset) is worth another run; the others say their fix
        again = "; run again (check_server_template = false skips the check)" if isinstance(exc, RetryableError) else ""
        raise PreflightError(f"{spec.name}: the server's chat template could not be checked: {exc}{again}") from None
    except TargetError as exc:
        raise PreflightError(f"{spec.name}: before any request: {exc}") from None
    if difference:
        raise PreflightError(
            f"{spec.name}: the server renders prompts with another chat template than target {target.name}: "
            f"{difference}; set `target` to the served model's profile or fix the server's template "
            "(check_server_template = false in the catalog entry generates anyway)"
        )
    log(f"{spec.name}: the server renders prompts as target {target.name} does (checked on one prompt)")


def config_hash(spec: DatasetSpec, engine: Engine) -> str:
    """The generation config's hash (the resume key's): what a canary's verdict holds for."""
    return resume_key(engine.config(), spec).config_hash

