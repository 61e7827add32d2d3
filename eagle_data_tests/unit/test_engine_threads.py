"""The embedded engine's torch thread count: the CPUs this process may use, less what other processes keep
busy on them (engines/cpus.py), measured on this machine's real /proc/stat against a real busy process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle_data.engines.cpus import WINDOW_S, ThreadMeter, busy_cpu_seconds, thread_count, usable_cpus


@pytest.mark.parametrize(
    ("cpus", "others_busy", "threads"),
    [(2, 0.0, 2), (2, 0.2, 2), (2, 0.3, 1), (2, 1.0, 1), (2, 1.9, 1), (1, 0.0, 1), (8, 3.0, 5), (8, 2.6, 5)],
)
def test_the_rule_takes_a_thread_for_each_cpu_others_leave_free(cpus: int, others_busy: float, threads: int):
    assert thread_count(cpus, others_busy) == threads


def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads /proc")
def test_a_busy_process_on_our_cpus_is_counted_and_takes_its_thread():
    """The spinner runs on this process's CPUs (it inherits the affinity); whatever share of a CPU it gets on a
    shared machine, the meter counts at least that, and leaves the engine no thread on the CPU it holds."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        meter = ThreadMeter()
        before, started = _cpu_seconds(spinner.pid), time.monotonic()
        threads = meter.count()  # the first count waits for a whole window
        spun = (_cpu_seconds(spinner.pid) - before) / (time.monotonic() - started)
    finally:
        spinner.kill()
        spinner.wait()
    assert meter.others_busy is not None and meter.others_busy >= spun - 0.1
    assert threads == meter.threads <= thread_count(len(usable_cpus()), spun - 0.1)
    assert meter.count() == threads  # within a window: the last count, no new look
    assert busy_cpu_seconds(frozenset({max(usable_cpus()) + 4096})) == 0.0
    assert WINDOW_S <= 1.0  # the first count of a process costs at most this wait


def test_the_scorers_forward_pass_runs_at_the_meters_count_not_torchs_default(demo_model: Path):
    """The on-policy scorer (and the capture, through the same `torch_threads`) ran at whatever torch's count
    was, every core by default, which spins on a busy machine; the count in its forward pass is the meter's,
    and the caller's count is back afterwards."""
    import torch

    from eagle_data.engines.cpus import process_meter
    from eagle_data.engines.scoring import Row, TransformersScorer
    from eagle_data.quality.on_policy import SamplingPoint

    scorer = TransformersScorer(demo_model)
    _, model = scorer._load()
    seen: list[int] = []
    hook = model.get_decoder().register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(len(usable_cpus()) + 1)  # more than the meter ever gives
    try:
        scorer.score([Row(list(range(100, 120)), [0] * 10 + [1] * 10, SamplingPoint(0.0))], top_k=5)
        assert torch.get_num_threads() == len(usable_cpus()) + 1
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert seen == [process_meter().threads] and 1 <= seen[0] <= len(usable_cpus())


def test_the_cpu_scorer_runs_each_row_alone_so_no_padding_is_computed(demo_model: Path):
    """Padded together, a shard's rows cost the longest row's length each (the demo's 10 rows: 6,850 tokens
    computed for 4,094); on the CPU each row is its own forward pass, of exactly its tokens."""
    from eagle_data.engines.scoring import Row, TransformersScorer
    from eagle_data.quality.on_policy import SamplingPoint

    scorer = TransformersScorer(demo_model)
    _, model = scorer._load()
    shapes: list[tuple[int, ...]] = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda _, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    rows = [Row(list(range(100, 100 + n)), [0] * 4 + [1] * (n - 4), SamplingPoint(0.0)) for n in (30, 12, 20)]
    try:
        scorer.score(rows, top_k=5)
    finally:
        hook.remove()
    assert sorted(shapes) == [(1, 12), (1, 20), (1, 30)]
