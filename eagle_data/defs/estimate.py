"""The estimate's two checks as the UI and generation see them: the materialization and check results of
`{ds}_estimate`, its summary in a person's words, and generation's refusal when either check failed.

`within_budget` and `canary` block generation by its own refusal (quality.registry `refused_downstream`):
generation's step starts, refuses before any request with the failed check's line and fails, so the UI
shows generation failed and why instead of a skipped step painted red (docs/running.md).
"""

from __future__ import annotations

import logging

import dagster as dg

from eagle_data import layout, quality
from eagle_data.catalog import DatasetSpec
from eagle_data.defs import instance as records
from eagle_data.defs.messages import leveled
from eagle_data.defs.metadata import REFUSED_FOR
from eagle_data.defs.resources import EngineResource
from eagle_data.runner import prices
from eagle_data.stages import estimate as estimate_stage
from eagle_data.stages.preflight import config_hash
from eagle_data.storage import ShardStore
from eagle_data.types import Engine

WITHIN_BUDGET = "within_budget"
CANARY = "canary"


def estimate_asset(spec: DatasetSpec) -> str:
    return layout.estimate_asset(spec.name)


def canary_key(spec: DatasetSpec) -> dg.AssetCheckKey:
    return dg.AssetCheckKey(dg.AssetKey(estimate_asset(spec)), CANARY)


def estimate_result(
    ds: str, found: estimate_stage.PreFlight, log: logging.Logger | dg.DagsterLogManager
) -> dg.MaterializeResult:
    """The estimate's materialization and its two checks, from what the canary and the projection found."""
    sample, result = found.canary, found.estimate
    (log.info if sample.passed else log.error)(sample.line)
    canary = dg.AssetCheckResult(
        check_name=CANARY, passed=sample.passed, severity=dg.AssetCheckSeverity.ERROR, description=sample.line,
        metadata=sample.metadata(),
    )  # fmt: skip
    if result is None:
        why = f"{ds}: no sampled prompt was answered, so nothing to project from; see the canary check"
        budget = dg.AssetCheckResult(check_name=WITHIN_BUDGET, passed=False, description=why)
        figures = {"summary": estimate_summary(found, why), **sample.figures()}
        return dg.MaterializeResult(metadata=figures, check_results=[budget, canary])
    log.info(f"pre-flight estimate: {result.line()}")
    over = result.over_budget()
    budget = dg.AssetCheckResult(
        check_name=WITHIN_BUDGET,
        passed=not over,
        severity=dg.AssetCheckSeverity.ERROR,
        description=over or result.line(),
        metadata={"est_tokens": result.tokens, **result.cost_figures(),
                  "token_budget": result.token_budget, "cost_budget_usd": result.cost_budget_usd},
    )  # fmt: skip
    figures = {"summary": estimate_summary(found, over), **result.figures(), **sample.figures()}
    return dg.MaterializeResult(metadata=figures, check_results=[budget, canary])


def estimate_summary(found: estimate_stage.PreFlight, over: str) -> dg.MetadataValue:
    """The estimate at the top of its page, in words: the canary's verdict, the projection, whether it fits
    the budgets, and, where no price is known, that the dollars are unknown (never a made-up $0.00)."""
    sample, result = found.canary, found.estimate
    lines = [f"**Canary: {'passed' if sample.passed else 'FAILED'}.** {sample.line}"]
    if result is not None:
        lines.append(f"**Projection:** {result.line()}")
        if result.usd is None:
            lines.append(
                "**Dollars: unknown.** No price is set and the sampled replies reported no cost: set "
                f"`{prices.PRICE_ENV}=PROMPT,COMPLETION` (USD per million tokens) or the estimate's "
                "`usd_per_million_*` run config to project them."
            )
    lines.append(f"**Budgets: {'OVER' if over else 'within'}.** {over or 'generation may start.'}")
    return dg.MetadataValue.md("\n\n".join(lines))


def estimate_gates(
    context: dg.AssetExecutionContext,
    spec: DatasetSpec,
    ignore_canary: bool,
    store: ShardStore,
    backend: Engine,
    engine: EngineResource,
) -> None:
    """Refuse a run the latest canary failed under this config, or whose estimate in this run found it over
    budget; judge the canary again when it judged another config."""
    ds = spec.name
    latest = records.latest_canary(context.instance, canary_key(spec))  # any state: a verdict or None
    current = config_hash(spec, backend)
    if refused := quality.canary_blocks(latest, current, ignore=ignore_canary, dataset=ds):
        raise refusal(context, CANARY, refused)
    budget = dg.AssetCheckKey(dg.AssetKey(estimate_asset(spec)), WITHIN_BUDGET)
    if over := records.failed_in_run(context.instance, budget, context.run.run_id):
        raise refusal(context, WITHIN_BUDGET, f"{ds}: refused before any request: {over.removeprefix(f'{ds}: ')}")
    if quality.canary_stale(latest, current, ignore=ignore_canary):  # judged under another config
        context.log.info(f"{ds}: the latest canary judged config {latest.config_hash}, not {current}: again")
        sample = estimate_stage.estimate(
            spec, store, backend, usd_per_prompt_token=0.0, usd_per_completion_token=0.0, log=leveled(context.log),
            settings=engine.runner_settings(), run_id=context.run.run_id,
        ).canary  # fmt: skip
        if not sample.passed:
            raise refusal(context, CANARY, f"{ds}: refused before the run: {sample.line.removeprefix(f'{ds}: ')}")


def refusal(context: dg.AssetExecutionContext, check: str, line: str) -> dg.Failure:
    """A step that will not pay because `check` failed: one line, never retried, naming the check (the
    run-failure alert leaves it to that check's own alert). Each of its partitions also gets an observation
    with that line: Dagster shows no failed materialization on an asset's Events tab, an observation it does."""
    metadata = {REFUSED_FOR: check, "refused": dg.MetadataValue.text(line)}
    for partition in context.partition_keys:  # generation is partitioned by shard
        observed = dg.AssetObservation(context.asset_key, partition=partition, description=line, metadata=metadata)
        context.log_event(observed)
    return dg.Failure(description=line, metadata={REFUSED_FOR: check}, allow_retries=False)
