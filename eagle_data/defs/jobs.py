"""The way real runs go: walk the catalog in order, one dataset at a time, each until done or at its budget.

`dagster job execute -m eagle_data.definitions -j walk_catalog` (or the UI's launchpad). Before a
dataset spends anything beyond a small sample, its pre-flight estimate (prompt tokens counted with the
target's tokenizer, completion tokens and dollars projected from the sample) is logged and recorded.
Every shard it writes is reported as a materialization of the matching asset partition.
"""

import dagster as dg

from eagle_data import pipeline
from eagle_data.catalog import catalog, get_dataset
from eagle_data.defs.assets import previous_figure
from eagle_data.defs.checks import check_evaluations, validated_key
from eagle_data.defs.resources import EngineResource, StorageResource


class WalkConfig(dg.Config):
    datasets: list[str] | None = None  # None: every catalog entry, in catalog order
    sample_prompts: int = 8  # prompts generated first to project completion length
    usd_per_million_prompt_tokens: float = 0.0  # the model's price, for the dollar estimate
    usd_per_million_completion_tokens: float = 0.0
    estimate_only: bool = False  # stop after the estimates


def _report(context: dg.OpExecutionContext, asset: str, per_partition: dict[str, dict]) -> None:
    for key, metadata in per_partition.items():
        context.log_event(dg.AssetMaterialization(asset_key=asset, partition=key, metadata=metadata))


@dg.op(description="Walk the catalog in order: prompts, estimate, generation (until done or budget), validation.")
def walk_datasets(
    context: dg.OpExecutionContext, config: WalkConfig, storage: StorageResource, engine: EngineResource
) -> None:
    store, settings = storage.store(), engine.runner_settings()
    specs = [get_dataset(name) for name in config.datasets] if config.datasets else list(catalog().values())
    for spec in specs:
        keys = spec.partition_keys
        context.log.info(f"{spec.name}: {len(keys)} shards")
        _report(context, pipeline.prompts_asset(spec), pipeline.write_prompts(spec, store, keys))
        backend = engine.make(spec)
        estimate = pipeline.estimate(
            spec,
            store,
            backend,
            sample_prompts=config.sample_prompts,
            usd_per_prompt_token=config.usd_per_million_prompt_tokens / 1e6,
            usd_per_completion_token=config.usd_per_million_completion_tokens / 1e6,
            log=context.log.info,
            settings=settings,
            run_id=context.run_id,
        )
        context.log.info(f"pre-flight estimate: {estimate.line()}")
        context.log_event(dg.AssetObservation(asset_key=spec.name, metadata=estimate.figures()))
        if config.estimate_only:
            continue
        _, per_partition = pipeline.generate(
            spec, store, keys, backend, log=context.log.info, settings=settings, run_id=context.run_id
        )
        _report(context, spec.name, per_partition)
        previous = previous_figure(context.instance, validated_key(spec), context.run_id)
        records, _ = pipeline.validate(spec, store, keys, previous)
        _report(context, pipeline.validated_asset(spec), {key: record["numbers"] for key, record in records.items()})
        for evaluation in check_evaluations(spec, records):  # asset checks do not run inside an op
            context.log_event(evaluation)


walk_catalog = dg.GraphDefinition(name="walk_catalog", node_defs=[walk_datasets]).to_job(
    description="Every dataset in catalog order, one at a time, each until done or at its budget.",
)
