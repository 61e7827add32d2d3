"""Pool slots never outlive their run: a killed run's generation slot is given back, with or without a daemon.

A run SIGKILLed from the CLI stays STARTED in the instance and keeps its concurrency-pool slot, so every
later generation step on that engine would wait for ever (Dagster logs the wait at DEBUG only). Here:
- the executor of every job records its run worker (`host:pid`) as a hidden run tag (WORKER_TAG),
  releases slots held by runs whose worker is gone before its own steps claim any, and, while one of its
  steps waits for a slot, logs at INFO which run holds it and re-checks that run every few seconds;
- a multiprocess step of generation dies with its run worker (`procs.die_with`), so a killed run
  stops paying for requests nobody would record, and "the run worker is gone" means "the run is gone";
- that executor starts step processes from a forkserver that imported Dagster and eagle_data's wiring
  once (STEP_PRELOAD), not as fresh interpreters that each import them;
- the `dead_run_reaper` sensor does the same release on the daemon's schedule, for slots nobody waits for yet.
A released run is marked failed, with a WARNING that names it. Runs recorded on another host are left to
Dagster's run monitoring (run launchers that can check their workers, e.g. Kubernetes).
"""

from __future__ import annotations

import multiprocessing
import os
import pkgutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import dagster as dg

import eagle_data.defs
from eagle_data import engines
from eagle_data.defs.instance import (
    default_executor,
    free_pool_slots,
    pool_info,
    pool_infos,
    pool_names,
    supports_pools,
    with_executor_config,
)
from eagle_data.procs import Liveness, die_with, liveness, worker_id

if TYPE_CHECKING:
    from eagle_data.defs.instance import ExecutionPlan, PlanOrchestrationContext, RetryMode

# Dagster's hidden namespace: the UI and GraphQL leave `.dagster/` tags out of a run's tags (the reaper
# still reads it from the instance), since a process id means nothing to the person looking at the run.
WORKER_TAG = ".dagster/eagle_data_run_worker"
WATCH_INTERVAL_S = 3.0  # how often a waiting run re-checks the holders of its pool

Log = Callable[[str], None]


def release_dead_holders(
    instance: dg.DagsterInstance, pools: Iterable[str], warn: Log, exclude_run: str | None = None
) -> list[str]:
    """Give back every slot of `pools` held by a run that has ended or whose worker is gone on this host,
    marking a still-STARTED one failed; returns the released run ids."""
    released = []
    for pool, info in pool_infos(instance, pools).items():
        for run_id in dict.fromkeys(slot.run_id for slot in info.claimed_slots):
            if run_id == exclude_run:
                continue
            run = instance.get_run_by_id(run_id)
            why = _gone(run)
            if why is None:
                continue
            failed = run is not None and not run.is_finished
            if failed:
                instance.report_run_failed(run, f"run worker {why}; its pool slots were released")
            free_pool_slots(instance, run_id)
            marked = " and marked the run failed" if failed else ""
            warn(f"pool {pool}: run {run_id} {why}; released its slot{marked}")
            released.append(run_id)
    return released


def _gone(run: dg.DagsterRun | None) -> str | None:
    """Why `run` can no longer hold a slot, or None while it may still be working."""
    if run is None:
        return "no longer exists"
    if run.is_finished:
        return f"already ended ({run.status.value})"
    worker = run.tags.get(WORKER_TAG)
    if worker and liveness(worker) is Liveness.GONE:
        return f"is gone (process {worker} no longer exists)"
    return None


def holders_line(instance: dg.DagsterInstance, pool: str, run_id: str) -> str | None:
    """ "step S waits for pool P: held by run R (step T, worker W)" while a step of `run_id` waits, else None."""
    info = pool_info(instance, pool)
    waiting = [p.step_key for p in info.pending_steps if p.run_id == run_id and p.assigned_timestamp is None]
    if not waiting:
        return None
    held = []
    for slot in info.claimed_slots:
        run = instance.get_run_by_id(slot.run_id)
        worker = run.tags.get(WORKER_TAG, "worker unknown") if run else "run deleted"
        held.append(f"run {slot.run_id} (step {slot.step_key}, {worker})")
    holders = ", ".join(held) or "nobody (the slot is being handed over)"
    return f"{', '.join(waiting)} waits for pool {pool} (limit {info.limit}): held by {holders}"


class PoolWatchExecutor(dg.Executor):
    """Dagster's default executor, plus the worker record and a watcher of the pools its steps use."""

    def __init__(self, inner: dg.Executor) -> None:
        self._inner = inner

    @property
    def retries(self) -> RetryMode:
        return self._inner.retries

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[dg.DagsterEvent]:
        instance, run_id, log = plan_context.instance, plan_context.run_id, plan_context.log
        instance.add_run_tags(run_id, {WORKER_TAG: worker_id()})
        pools = sorted({step.pool for step in execution_plan.steps if step.pool})
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(instance, run_id, pools, log, stop), daemon=True)
        if pools and supports_pools(instance):
            release_dead_holders(instance, pools, log.warning, exclude_run=run_id)
            watcher.start()
        try:
            yield from self._inner.execute(plan_context, execution_plan)
        finally:
            stop.set()

    @staticmethod
    def _watch(
        instance: dg.DagsterInstance, run_id: str, pools: list[str], log: dg.DagsterLogManager, stop: threading.Event
    ) -> None:
        told: dict[str, str] = {}
        while not stop.wait(WATCH_INTERVAL_S):
            for pool in pools:
                line = holders_line(instance, pool, run_id)
                if line is None:
                    continue
                if release_dead_holders(instance, [pool], log.warning, exclude_run=run_id):
                    continue
                if told.get(pool) != line:  # once per change of holders, not every few seconds
                    log.info(line)
                    told[pool] = line


# What a step process imports before its first line of work, measured with `python -X importtime` (about
# 1.3 CPU-s a step when each step was a fresh `spawn` interpreter). The forkserver imports these once per run
# and forks every step from itself. Only imports without side effects belong here: an error other than
# ImportError kills the forkserver, so not `eagle_data.definitions` (its import reads the catalog and the
# environment and builds the definitions: each step still does that itself), and nothing that loads torch
# (a fork must not share its state, CUDA above all). Polars starts allocator threads at import; a fork is
# safe from them (polars and jemalloc register fork handlers) and its thread pool starts at a first query.
# A name a later Dagster moves is skipped by the forkserver (ImportError): that costs time, not correctness.
STEP_PRELOAD = (
    "dagster._cli.api",  # the step's entry point in Dagster's child process
    "upath.implementations.local",  # the instance's defs-state storage
    "dagster_aws.s3",  # an S3 root's client (defs/resources.py imports it only when it builds one)
    *(f"eagle_data.defs.{module.name}" for module in pkgutil.iter_modules(eagle_data.defs.__path__)),
    *engines.BUILTIN_MODULES,
)


def _create(init_context: dg.InitExecutorContext) -> dg.Executor:
    return PoolWatchExecutor(default_executor(_forkserver_by_default(init_context)))


def _forkserver_by_default(init_context: dg.InitExecutorContext) -> dg.InitExecutorContext:
    """Start steps from a forkserver preloaded with STEP_PRELOAD, unless the run config names a start method
    (or runs in process)."""
    config, instance = init_context.executor_config, init_context.instance
    multiprocess = config.get("multiprocess")
    if not isinstance(multiprocess, Mapping) or multiprocess.get("start_method") or not instance.is_persistent:
        return init_context  # steps in separate processes need a persistent instance: Dagster says so itself
    if "forkserver" not in multiprocessing.get_all_start_methods():  # Windows
        return init_context
    ref = instance.get_ref()  # the step process builds this instance's storage classes
    storage = [data.module_name for data in (ref.storage_data, ref.compute_logs_data) if data is not None]
    preload = {"preload_modules": [*STEP_PRELOAD, *storage]}
    return with_executor_config(
        init_context, {**config, "multiprocess": {**multiprocess, "start_method": {"forkserver": preload}}}
    )


pool_watch_executor = dg.ExecutorDefinition(
    name="pool_watch_executor",
    config_schema=dg.multi_or_in_process_executor.config_schema,
    requirements=dg.multi_or_in_process_executor.get_requirements,
    executor_creation_fn=_create,
    description="Dagster's multiprocess/in-process executor that releases pool slots of dead runs.",
)


def tie_to_run_worker(context: dg.AssetExecutionContext) -> None:
    """In a step's own process (multiprocess executor), die with the run worker that started it; if that
    worker is already gone (killed while this process was starting), fail before spending anything."""
    run = context.instance.get_run_by_id(context.run_id)  # the tag was added after the run object was sent here
    worker = run.tags.get(WORKER_TAG, "") if run else ""
    pid = worker.rpartition(":")[2]
    if not pid.isdigit() or int(pid) == os.getpid():
        return
    state = liveness(worker)
    if state is Liveness.ALIVE:
        die_with(int(pid))
        state = liveness(worker)  # it may have died before the tie took hold: then nothing would end this step
    if state is Liveness.GONE:
        raise dg.Failure(f"run worker {worker} is gone (the run was killed): this step stops; re-run to resume")


def dead_run_reaper() -> dg.SensorDefinition:
    @dg.sensor(
        name="dead_run_reaper",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Releases pool slots held by runs whose worker process is gone, and marks those runs failed.",
    )
    def reaper(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        pools = pool_names(context.instance)
        released = release_dead_holders(context.instance, pools, context.log.warning)
        return dg.SkipReason(f"released the slots of {len(released)} dead run(s)" if released else "no dead run")

    return reaper
