"""What importing dagster-aws and boto3 costs a step process started from the preloaded forkserver.

Step processes fork from a forkserver that imported STEP_PRELOAD (eagle_data/defs/pools.py) once per run.
Each variant starts a forkserver of its own with that preload (plus, for the `preloaded` rows, the S3
modules too), forks `--repeats` children from it one after another, and times what each child does
before its first line of work: the imports, and an S3 client built the way the storage resource builds it.
Wall and CPU seconds are the child's own (perf_counter, getrusage); the forkserver's start (paid once per
run, not per step) is timed separately. Usage: python benchmarks/bench_step_start.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import resource
import statistics
import sys
import time
from collections.abc import Sequence

from eagle_data.defs.pools import STEP_PRELOAD

S3_MODULES = ("boto3", "dagster_aws.s3")
VARIANTS = {  # name: (extra preload, what the child imports, whether it builds a client)
    "nothing (baseline)": ((), (), False),
    "boto3": ((), ("boto3",), False),
    "dagster_aws.s3 (S3Resource)": ((), ("dagster_aws.s3",), False),
    "dagster_aws.s3 + an S3 client": ((), ("dagster_aws.s3",), True),
    "preloaded: dagster_aws.s3 + an S3 client": (S3_MODULES, ("dagster_aws.s3",), True),
}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(modules: Sequence[str], client: bool, results: multiprocessing.Queue) -> None:
    """A stand-in step: what it imports and builds before its first line of work, timed from inside."""
    wall0, cpu0 = time.perf_counter(), cpu_s()
    for name in modules:
        importlib.import_module(name)
    if client:
        from dagster_aws.s3 import S3Resource

        S3Resource(endpoint_url="http://127.0.0.1:9", region_name="us-east-1").get_client()
    results.put((time.perf_counter() - wall0, cpu_s() - cpu0))


def variant(preload: Sequence[str], modules: Sequence[str], client: bool, repeats: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*STEP_PRELOAD, *preload])
    results: multiprocessing.Queue = ctx.Queue()
    started = time.perf_counter()
    first = ctx.Process(target=child, args=((), False, results))  # starts the forkserver (its preload)
    first.start()
    first.join()
    results.get()
    server_s = time.perf_counter() - started
    walls, cpus = [], []
    for _ in range(repeats):
        proc = ctx.Process(target=child, args=(modules, client, results))
        proc.start()
        wall, cpu = results.get()
        proc.join()
        walls.append(wall)
        cpus.append(cpu)
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # the next variant starts its own server with its own preload
    return {"server_s": server_s, "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"{'child imports / builds':44} {'step wall s':>11} {'step CPU s':>10} {'forkserver start s':>19}")
    for name, (preload, modules, client) in VARIANTS.items():
        row = variant(preload, modules, client, args.repeats)
        print(f"{name:44} {row['wall_s']:11.3f} {row['cpu_s']:10.3f} {row['server_s']:19.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
