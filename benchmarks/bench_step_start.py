"""What importing dagster-aws and boto3 costs a step process started from the preloaded forkserver.

Step processes fork from a forkserver that imported STEP_PRELOAD (eagle_data/defs/pools.py) once per run;
it names dagster_aws.s3, which defs/resources.py imports only when it builds a client. Each variant starts
a forkserver of its own with a preload, either the shipped one or the same less eagle_data.defs and
dagster-aws, forks `--repeats` children from it one after another, and times
what each child does before its first line of work: the imports, and an S3 client built the way the
storage resource builds it (dagster-aws's S3Resource). Wall and CPU seconds are the child's own
(perf_counter, getrusage); the forkserver's start (once per run, not per step) is timed separately; the
last column says whether dagster_aws was already imported in the child. Usage:
python benchmarks/bench_step_start.py [--repeats 7]
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
from typing import Any

from eagle_data.defs.pools import STEP_PRELOAD

WITHOUT_AWS = tuple(m for m in STEP_PRELOAD if not m.startswith(("eagle_data.defs.", "dagster_aws")))
VARIANTS = {  # name: (preload, what the child imports, whether it builds a client)
    "nothing (baseline)": (WITHOUT_AWS, (), False),
    "boto3": (WITHOUT_AWS, ("boto3",), False),
    "dagster_aws.s3 (S3Resource)": (WITHOUT_AWS, ("dagster_aws.s3",), False),
    "dagster_aws.s3 + an S3 client": (WITHOUT_AWS, ("dagster_aws.s3",), True),
    "shipped STEP_PRELOAD: an S3 client": (STEP_PRELOAD, ("dagster_aws.s3",), True),
}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(modules: Sequence[str], client: bool, results: multiprocessing.Queue) -> None:
    """A stand-in step: what it imports and builds before its first line of work, timed from inside."""
    wall0, cpu0, preloaded = time.perf_counter(), cpu_s(), "dagster_aws" in sys.modules
    for name in modules:
        importlib.import_module(name)
    if client:
        from dagster_aws.s3 import S3Resource

        S3Resource(endpoint_url="http://127.0.0.1:9", region_name="us-east-1").get_client()
    results.put((time.perf_counter() - wall0, cpu_s() - cpu0, preloaded))


def variant(preload: Sequence[str], modules: Sequence[str], client: bool, repeats: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    results: multiprocessing.Queue = ctx.Queue()
    started = time.perf_counter()
    first = ctx.Process(target=child, args=((), False, results))  # starts the forkserver (its preload)
    first.start()
    first.join()
    results.get()
    server_s = time.perf_counter() - started
    walls, cpus, preloaded = [], [], False
    for _ in range(repeats):
        proc = ctx.Process(target=child, args=(modules, client, results))
        proc.start()
        wall, cpu, preloaded = results.get()
        proc.join()
        walls.append(wall)
        cpus.append(cpu)
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # the next variant starts its own server with its own preload
    return {"server_s": server_s, "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
            "preloaded": preloaded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"{'child imports / builds':44} {'step wall s':>11} {'step CPU s':>10} {'forkserver start s':>19} "
          "dagster_aws preloaded")
    for name, (preload, modules, client) in VARIANTS.items():
        row = variant(preload, modules, client, args.repeats)
        print(f"{name:44} {row['wall_s']:11.3f} {row['cpu_s']:10.3f} {row['server_s']:19.2f} {row['preloaded']}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
