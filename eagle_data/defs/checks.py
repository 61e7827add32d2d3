"""Asset checks of every catalog dataset: the quality gates of eagle_data.quality on `{ds}_validated`.

Validation evaluates every gate once per shard and stores the results in the shard's quality record;
one multi-asset check per dataset reports those stored results (rebuilding a stale record from its
shard), so a check re-run never re-reads token ids. Every run, one partition, a range or none, is judged
shard by shard: one evaluation per gate and shard, naming its partition, the materialization it judged
and the sha256 of the shard bytes it judged (`shard_sha256`), so each shard's status in the UI's Checks
tab is its own and the export's gate can tell which materialization a result belongs to.
The blocking gates (`empty_response`, `token_structure`, `lost_text`, `failed_rate`) fail the step when
one fails on any shard, and the exports downstream do not run. Check metadata carries `figure` and
`threshold`, which alerts quote.

The check can run a subset of its gates (`can_subset`), which is what lets the UI re-run checks from the
asset's Checks tab ("Execute all"). That button launches a run without a partition; such a run judges
every materialized shard.
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dagster as dg

from eagle_data import layout, quality, report
from eagle_data.catalog import DatasetSpec
from eagle_data.defs.assets import partitions
from eagle_data.defs.estimate import CANARY, WITHIN_BUDGET
from eagle_data.defs.instance import latest_materializations, target
from eagle_data.defs.messages import user_failure
from eagle_data.defs.metadata import SHARD_DIGEST
from eagle_data.defs.registry import check_outcome, check_specs
from eagle_data.defs.resources import StorageResource
from eagle_data.quality import registry
from eagle_data.storage import ShardStore

ESTIMATE_CHECKS = registry.implemented("estimate", (WITHIN_BUDGET, CANARY))  # judged in the estimate's own step


def validated_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey(layout.validated_asset(spec.name))


def check_keys(spec: DatasetSpec) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(validated_key(spec), d.name) for d in quality.CHECKS]


def blocked_steps(instance: dg.DagsterInstance, run_id: str) -> dict[str, list[str]]:
    """Step key -> the blocking checks that failed in it, in one run, as the registry declares them: every
    blocking check counts (the quality gates, `decontamination`, the capture's, and the estimate's, whose
    downstream step refuses itself rather than being skipped)."""
    blocked: dict[str, list[str]] = {}
    for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        evaluation = event.dagster_event.event_specific_data
        declared = registry.BY_NAME.get(evaluation.check_name)
        if declared is not None and declared.blocking and not evaluation.passed:
            blocked.setdefault(event.step_key or "", []).append(evaluation.check_name)
    return blocked


def failed_blocking_checks(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """Names of the blocking checks that failed in a run."""
    return [name for names in blocked_steps(instance, run_id).values() for name in names]


def judged_partitions(
    context: dg.AssetCheckExecutionContext | dg.AssetExecutionContext,
    key: dg.AssetKey,
    shards: dg.PartitionsDefinition,
) -> list[str]:
    """The shards a check step judges (an asset check's, or a subsettable asset's checks-only step): its
    partition or range, or in a run without a partition (the Checks tab's "Execute all") every materialized
    shard that is still one of `shards` (a shrunk mix drops capture shards; the event log keeps them)."""
    if context.has_partition_key or context.has_partition_key_range:
        return list(context.partition_keys)
    current = set(shards.get_partition_keys(dynamic_partitions_store=context.instance))
    keys = sorted(current & context.instance.get_materialized_partitions(key))
    if not keys:
        raise dg.Failure(f"no partition of {key.to_user_string()} is materialized yet: materialize one first")
    return keys


Judge = Callable[[str], tuple[str, list[dict[str, Any]]]]  # partition -> (shard digest, each check's outcome)


def report_shards(
    context: dg.AssetCheckExecutionContext | dg.AssetExecutionContext,
    key: dg.AssetKey,
    partitions: Sequence[str],
    judge: Judge,
) -> Iterator[dg.AssetCheckEvaluation | dg.Output]:
    """One evaluation per (selected check, shard): `judge(partition)` gives the digest of the shard bytes
    judged and each check's outcome (AssetCheckEvaluation fields); each names the shard's latest
    materialization. A failed blocking check fails the step with one line naming every failing shard, so
    the run's downstream steps do not start; otherwise it yields the checks' outputs they wait on
    (Dagster would emit them itself, logging that the step "did not yield expected outputs")."""
    selected, blocked = {k.name for k in context.selected_asset_check_keys}, []
    latest = latest_materializations(context.instance, key, partitions)
    for partition in partitions:
        shard_sha256, outcomes = judge(partition)
        for outcome in (o for o in outcomes if o["check_name"] in selected):
            metadata = {**outcome.get("metadata", {}), SHARD_DIGEST: shard_sha256}
            yield dg.AssetCheckEvaluation(
                **{**outcome, "metadata": metadata}, asset_key=key, partition=partition,
                target_materialization_data=target(latest.get(partition)),
            )  # fmt: skip
            if outcome["blocking"] and not outcome["passed"]:
                blocked.append(f"{outcome['check_name']} on {partition}")
    if blocked:
        raise dg.Failure(
            f"{key.to_user_string()}: blocking check(s) failed: {', '.join(blocked)}; see each shard's evaluation"
        )
    for check in context.selected_asset_check_keys:  # the outputs downstream steps wait on, said explicitly
        yield dg.Output(None, output_name=dg.AssetCheckSpec(check.name, asset=check.asset_key).get_python_identifier())


def stored_results(spec: DatasetSpec, store: ShardStore, log: Callable[[str], None], run_id: str = "") -> Judge:
    """A shard's stored check results (its quality record), with the digest of the bytes they judged. A record
    judged under other severities or blocking flags than the registry's, or other thresholds, is rebuilt on
    reading (quality.records) and stored, by run `run_id`: the export's admission reads the stored record."""

    def judge(partition: str) -> tuple[str, list[dict[str, Any]]]:
        record = report.read_record(spec, store, partition, log, run_id)
        return record.shard_sha256, [check_outcome(r.name, r.passed, r.message, r.metadata()) for r in record.results]

    return judge


def dataset_checks(spec: DatasetSpec) -> dg.AssetChecksDefinition:
    key, shards = validated_key(spec), partitions(spec)
    specs = check_specs("gates", key, shards)

    @dg.multi_asset_check(
        name=f"{spec.name}_quality_checks", specs=specs, can_subset=True, description=f"{spec.title}: quality gates."
    )
    @user_failure
    def checks(context: dg.AssetCheckExecutionContext, storage: StorageResource):
        judge = stored_results(spec, storage.store(), context.log.warning, context.run.run_id)
        yield from report_shards(context, key, judged_partitions(context, key, shards), judge)

    return checks


def build_checks(specs: Sequence[DatasetSpec]) -> list[dg.AssetChecksDefinition]:
    """One multi-asset check per dataset, partitioned like the dataset's assets."""
    return [dataset_checks(spec) for spec in specs]
