"""The assets of every catalog dataset: `{ds}_prompts` -> `{ds}_estimate` -> `{ds}` (generation) -> `{ds}_validated`.

One small builder per asset. The shard assets return their shards and receive their inputs through the shard
IO manager (defs/io_managers.py), which writes one Parquet file per partition, so a single run can cover a
partition range. The bodies only call the stages (eagle_data.stages).
"""

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import dagster as dg
from pydantic import Field

from eagle_data import layout, quality, sources, stage_table
from eagle_data.catalog import DatasetSpec
from eagle_data.defs import instance as records
from eagle_data.defs.estimate import estimate_asset, estimate_gates, estimate_result
from eagle_data.defs.io_managers import DATASET_TAG, SHARD_IO
from eagle_data.defs.messages import file_locations, leveled, user_failure
from eagle_data.defs.metadata import (
    dataset_report_metadata,
    dataset_summary,
    rounded_figures,
    row_count_metadata,
)
from eagle_data.defs.pools import tie_to_run_worker
from eagle_data.defs.registry import check_specs
from eagle_data.defs.resources import EngineResource, StorageResource, environment_kind, generation_pool
from eagle_data.runner.rows import GENERATION_SCHEMA
from eagle_data.stages import estimate as estimate_stage
from eagle_data.stages import generation as generation_stage
from eagle_data.stages import prompts as prompts_stage
from eagle_data.stages import validation as validation_stage
from eagle_data.storage.shards import LazyShards, StoredShards


class PromptsConfig(dg.Config):
    source_path: str | None = None  # a local parquet/JSONL file in the source's schema, instead of the hub


class EstimateConfig(dg.Config):
    canary_prompts: int | None = Field(
        None, gt=0, description="Prompts drawn across the dataset for the canary and the projection (reused by "
        "the full run); unset: the catalog's canary_prompts.",
    )  # fmt: skip
    usd_per_million_prompt_tokens: float = 0.0  # the model's price, for the dollar projection
    usd_per_million_completion_tokens: float = 0.0


class GenerationConfig(dg.Config):
    retry_rejected: bool = Field(
        False,
        description="Request again the rows the last validation rejected for engine-side reasons "
        "(empty, too short, no reasoning, lost text) instead of reusing them.",
    )
    ignore_canary: bool = Field(
        False, description="Run even though the latest canary of this dataset failed under this generation config."
    )


def partitions(spec: DatasetSpec) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition(spec.partition_keys)


def engine_kind() -> str:
    """The generation asset's `engine` tag: the environment's kind (or the demo profile's), read at load."""
    return environment_kind() or "unset"


def catalog_labels(stage: str, owners: Iterable[str], description: str, **tags: str) -> dict[str, Any]:
    """Owners (from the catalog), the stage's tag and description of one stage's asset, as `@dg.asset` keyword
    arguments. The Catalog lists assets by name ({ds} before {ds}_prompts); the `stage` tag and the
    description's first words give the flow order instead."""
    tag = stage_table.stage(stage).tag
    number, name = tag.split("-", 1)
    return {
        "owners": sorted(set(owners)),
        "tags": {"stage": tag, **tags},
        "description": f"Stage {number}, {name}. {description}",
    }


def shard_metadata(record: quality.ShardRecord) -> dict[str, Any]:
    """One partition's event metadata: its own shard's figures only, so an event's size never grows with
    the run's range (dataset-wide tables live in the HTML report)."""
    figures = record.figures()
    tables = {name: dg.MetadataValue.md(table) for name, table in figures.tables.items()}
    return {**rounded_figures(figures.numbers), **tables}


COLUMN_SCHEMA = "dagster/column_schema"  # Dagster's own: shown in the catalog
VALIDATED_COLUMNS = "columns"  # the validated asset's: one row under Metadata, below its summary (build_validated)


def column_schema(columns: Mapping[str, Any]) -> dg.TableSchema:
    """The Parquet columns of a shard (name -> polars dtype), as the schema the asset's page shows."""
    return dg.TableSchema(columns=[dg.TableColumn(name, str(dtype)) for name, dtype in columns.items()])


def add_row_counts(context: dg.AssetExecutionContext, rows: Mapping[str, int]) -> None:
    """Each written partition's own rows, and the dataset's as Dagster's Row count (the IO manager adds its
    shard's URI and link)."""
    others = records.latest_partition_metadata(context.instance, context.asset_key, exclude=rows.keys())
    for key, counts in row_count_metadata(rows, others).items():
        context.add_asset_metadata(counts, partition_key=key)


def stage_asset(stage: stage_table.Stage, spec: DatasetSpec, description: str, **tags: str) -> dict[str, Any]:
    """A dataset stage's `@dg.asset` keyword arguments, from its record in the stage table: name, the input it
    loads (`shards`) and the stages it follows, group, partitions (a single-run range), the shard IO manager
    when it makes shards, the code version that follows its settings, owners, tags and description."""
    args: dict[str, Any] = {
        "name": stage_table.asset_of(stage.name, spec.name),
        "deps": [stage_table.asset_of(after, spec.name) for after in stage.after],
        "group_name": spec.name,
        "code_version": stage.version(spec),
        **catalog_labels(stage.name, spec.owners, f"{spec.title}: {description}", **tags),
    }
    if stage.reads:
        args["ins"] = {"shards": dg.AssetIn(key=stage_table.asset_of(stage.reads, spec.name))}
    if stage.partitioning == "shard":
        # A range is one run: one generation step fills an engine with many shards. The estimate is partitioned
        # too (it estimates the whole dataset once per run), so "Materialize all" on a group is one backfill.
        args.update(partitions_def=partitions(spec), backfill_policy=dg.BackfillPolicy.single_run())
    if stage.makes_shards:
        args["io_manager_key"] = SHARD_IO
    return args


def build_prompts(spec: DatasetSpec) -> dg.AssetsDefinition:
    ds = spec.name

    @dg.asset(
        kinds={"polars", "parquet"},
        **stage_asset(
            stage_table.PROMPTS, spec, f"normalized, de-duplicated prompts, {spec.shard_size} per shard.",
            **{DATASET_TAG: ds},
        ),
    )  # fmt: skip
    @user_failure
    def prompts(
        context: dg.AssetExecutionContext, config: PromptsConfig, storage: StorageResource
    ) -> dg.Output[LazyShards]:
        store = storage.store()
        made = prompts_stage.make_prompts(spec, store, context.partition_keys, config.source_path, context.log.warning)
        figures = made.to_metadata()
        context.log.info(f"{ds}: wrote {figures['prompts']} prompts, skipped {figures['skipped']} rows")
        path = store.uri(store.shard_key(ds, layout.prompts_asset(spec.name), "{partition}"))
        add_row_counts(context, made.prompts)
        schema = column_schema(sources.PROMPTS_SCHEMA)
        return dg.Output(made.shards, metadata={**figures, "path": dg.MetadataValue.path(path), COLUMN_SCHEMA: schema})

    return prompts


def build_estimate(spec: DatasetSpec) -> dg.AssetsDefinition:
    ds = spec.name

    @dg.asset(
        kinds={"python"},
        **stage_asset(
            stage_table.ESTIMATE,
            spec,
            "a canary sample drawn across the dataset, judged by the quality gates; tokens and dollars projected "
            "from it, checked against the budgets.",
            dataset=ds,
        ),
        check_specs=check_specs("estimate", estimate_asset(spec)),
    )
    @user_failure
    def estimate(
        context: dg.AssetExecutionContext, config: EstimateConfig, storage: StorageResource, engine: EngineResource
    ) -> dg.MaterializeResult:
        found = estimate_stage.estimate(
            spec,
            storage.store(),
            engine.make(spec),
            canary_prompts=config.canary_prompts,
            usd_per_prompt_token=config.usd_per_million_prompt_tokens / 1e6,
            usd_per_completion_token=config.usd_per_million_completion_tokens / 1e6,
            log=leveled(context.log),
            settings=engine.runner_settings(),
            run_id=context.run_id,
        )
        return estimate_result(ds, found, context.log)

    return estimate


def build_generation(spec: DatasetSpec) -> dg.AssetsDefinition:
    ds = spec.name

    @dg.asset(
        pool=generation_pool(),  # the environment's engine, read once: Dagster pools are fixed per asset
        kinds={"python", "parquet"},
        **stage_asset(
            stage_table.GENERATION,
            spec,
            "every reply regenerated by the target model; results durable as they land.",
            dataset=ds,
            engine=engine_kind(),
        ),
    )
    @user_failure
    def generation(
        context: dg.AssetExecutionContext,
        config: GenerationConfig,
        storage: StorageResource,
        engine: EngineResource,
        shards: StoredShards,
    ) -> dg.Output[LazyShards]:
        tie_to_run_worker(context)  # a killed run stops paying for requests
        backend = engine.make(spec)  # refuses a run-config kind other than the one the pool was fixed from
        store = storage.store()
        estimate_gates(context, spec, config.ignore_canary, store, backend, engine)
        context.log.info(f"{ds}: engine {backend.describe()}")
        made = generation_stage.generate(
            spec,
            store,
            shards,
            backend,
            log=leveled(context.log),
            settings=engine.runner_settings(),
            retry_rejected=config.retry_rejected,
            run_id=context.run_id,
        )
        add_row_counts(context, {key: f.counts.done for key, f in made.per_partition.items()})
        schema = column_schema(GENERATION_SCHEMA)
        return dg.Output(made.shards, metadata={**made.figures, "engine": backend.describe(), COLUMN_SCHEMA: schema})

    return generation


def build_validated(spec: DatasetSpec) -> dg.AssetsDefinition:
    ds = spec.name

    @dg.asset(
        kinds={"polars", "parquet"},
        **stage_asset(
            stage_table.VALIDATED,
            spec,
            f"token ids and loss masks for target {spec.target}, with per-row verdicts.",
            dataset=ds,
            target=spec.target,
        ),
    )
    @user_failure
    def validated(
        context: dg.AssetExecutionContext, storage: StorageResource, shards: StoredShards
    ) -> dg.Output[LazyShards]:
        store = storage.store()
        done = validation_stage.validate(spec, store, shards, log=context.log.warning, run_id=context.run.run_id)
        verdicts: Counter[str] = Counter()
        for key, record in done.records.items():  # the IO manager adds the shard's URI and digest
            page = file_locations(store, {"shard_report": layout.quality_page(ds, key)})
            context.add_asset_metadata({**shard_metadata(record), **page}, partition_key=key)
            verdicts.update(record.summary.verdicts)
        assert done.report is not None
        context.log.info(f"{ds}: verdicts {dict(sorted(verdicts.items()))}; quality report {done.report.uri}")
        report = file_locations(store, {"quality_report": layout.quality_index(ds)})
        link = report.get("quality_report_link")
        metadata = {  # in the order the asset's page lists them: the summary and the report's link first
            "summary": dataset_summary(done.report, str(link.value) if link else None),
            **report,
            **dataset_report_metadata(done.report),  # the report's headline, readable without opening a file
            # Under Metadata, one row that opens the table: as `dagster/column_schema` the page would show it
            # as a Columns section of one row per column above all of these (AssetNodeOverview.tsx).
            VALIDATED_COLUMNS: column_schema(done.columns),
        }
        return dg.Output(done.shards, metadata=metadata)

    return validated


BUILDERS: dict[str, Callable[[DatasetSpec], dg.AssetsDefinition]] = {
    "prompts": build_prompts,
    "estimate": build_estimate,
    "generation": build_generation,
    "validated": build_validated,
}


def build_dataset_assets(spec: DatasetSpec) -> list[dg.AssetsDefinition]:
    """A dataset's assets, one per dataset stage of the stage table, in flow order."""
    return [BUILDERS[stage.name](spec) for stage in stage_table.DATASET_STAGES]
