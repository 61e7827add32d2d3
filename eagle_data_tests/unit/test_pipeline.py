"""The generation stage as the assets call it: figures merged across shards, the truncation warning."""

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eagle_data import layout
from eagle_data.catalog import Breaker, DatasetSpec, load_catalog
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.stages.estimate import estimate
from eagle_data.stages.preflight import PreflightError
from eagle_data.stages.prompts import PromptShards
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data_tests import fixtures_stages as stage


def test_generate_sums_shard_counts_and_warns_when_replies_hit_max_tokens(tmp_path: Path):
    server = FakeOpenAI(Faults(reply_tokens=(20, 60)))
    server.start()
    try:
        spec = spec_for_tests()
        spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"max_tokens": 40})})
        store, shards = ShardStore(str(tmp_path)), prompt_shards(2, 50)
        for key, frame in shards.items():
            store.write_shard(spec.name, layout.prompts_asset(spec.name), key, frame)
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=40)
        lines: list[str] = []
        figures, per_partition = stage.generate(
            spec, store, list(shards), engine, log=lines.append, settings=RunnerSettings(progress_bar=False)
        )
    finally:
        server.stop()
    assert figures["total"] == 100 and [f.counts.total for f in per_partition.values()] == [50, 50]
    assert figures["truncated"] == server.outcomes["truncated"] > 5  # ~half the natural lengths exceed 40
    assert figures["suggested_max_tokens"] >= 60 and "set max_tokens to about" in figures["truncation_warning"]
    assert any(line.startswith("WARNING b7_sharegpt: truncation") for line in lines)


def test_a_range_runs_error_counts_are_the_sum_of_its_shards(tmp_path: Path):
    """Every shard fails its own way: the first's prompts on their second turn (HTTP 500), the last's
    poisoned replies; the run's errors_by_kind must hold both, not only the last shard's."""
    server = FakeOpenAI(Faults(fail_turn=2, poison_prompts=("s2-p3", "s2-p4")))
    server.start()
    spec, store = spec_for_tests(breaker=Breaker(enabled=False)), ShardStore(str(tmp_path))
    shards = {**prompt_shards(3, 10), "00000": prompt_shards(1, 10, turns=2)["00000"]}
    for key, frame in shards.items():
        store.write_shard(spec.name, layout.prompts_asset(spec.name), key, frame)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m")
    settings = RunnerSettings(progress_bar=False, backoff_base_s=0.0, backoff_cap_s=0.0, max_attempts=2)
    try:
        figures, per_partition = stage.generate(spec, store, sorted(shards), engine, log=lambda _: None,
                                                   settings=settings)  # fmt: skip
    finally:
        server.stop()
    per_shard = [Counter(f.to_metadata()["errors_by_kind"]) for f in per_partition.values()]
    assert per_shard[0] and not per_shard[1] and per_shard[2] and not set(per_shard[0]) & set(per_shard[2])
    assert figures["errors_by_kind"] == dict(sorted(sum(per_shard, Counter()).items()))
    assert figures["failed"] == sum(f.counts.failed for f in per_partition.values()) == 12


def test_generate_reads_each_prompt_shard_only_when_the_runner_reaches_it(tmp_path: Path):
    """A range run holds the shards in flight, not the whole range: when shard k is read, shards before
    k-2 are already written (4 in flight, 20 prompts a shard), and every shard is read exactly once."""
    server = FakeOpenAI(Faults(latency_s=0.005))
    server.start()
    spec, store, shards = spec_for_tests(), ShardStore(str(tmp_path)), prompt_shards(6, 20)
    for key, frame in shards.items():
        store.write_shard(spec.name, layout.prompts_asset(spec.name), key, frame)
    reads: list[tuple[str, set[str]]] = []

    class Watched(PromptShards):
        def __getitem__(self, key: str):
            reads.append((key, {p for p in shards if store.shard_exists(spec.name, spec.name, p)}))
            return super().__getitem__(key)

    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m")
    settings = RunnerSettings(progress_bar=False, max_in_flight=4, initial_in_flight=4, min_in_flight=1)
    try:
        reports = run_generation(engine, spec, Watched(spec, store, list(shards)), store, settings=settings,
                                          log=lambda _: None)  # fmt: skip
    finally:
        server.stop()
    assert [key for key, _ in reads] == list(shards)
    for k, (_, written) in enumerate(reads):
        assert {f"{i:05d}" for i in range(k - 2)} <= written, f"shard {k} read before shard {k - 3} was written"
    assert sum(r.figures.counts.ok for r in reports.values()) == 120


def test_the_estimate_projects_from_this_configs_sample_not_from_rows_of_an_earlier_config(tmp_path: Path):
    """A shard generated under an earlier config (replies of 10 tokens) must not stand in for this
    config's sample (replies of 50): the budget check would be judged on another model's lengths."""
    spec = load_catalog(profile="demo")["b7_sharegpt"].model_copy(
        update={"token_budget": 0, "cost_budget_usd": 0.0, "target": "qwen3-test"}
    )
    store, settings = ShardStore(str(tmp_path)), RunnerSettings(progress_bar=False)
    stage.write_prompts(spec, store, ["00000"], warn=lambda _: None)
    server = FakeOpenAI(Faults(reply_tokens=(10, 10)))
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/v1"
        earlier = make_engine("openai", base_url=url, model="earlier")
        stage.generate(spec, store, ["00000"], earlier, log=lambda _: None, settings=settings)
        server.faults = Faults(reply_tokens=(50, 50))
        projected = estimate(
            spec, store, make_engine("openai", base_url=url, model="now"), canary_prompts=4,
            usd_per_prompt_token=0.0, usd_per_completion_token=0.0, log=lambda _: None, settings=settings,
        ).estimate  # fmt: skip
    finally:
        server.stop()
    assert projected is not None and projected.sample_rows == 4 and projected.avg_completion_tokens == 50


def _refused_before_any_request(store: ShardStore, spec: DatasetSpec, match: str) -> None:
    server = FakeOpenAI()
    server.start()
    try:
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m")
        quiet = {"log": lambda _: None, "settings": RunnerSettings(progress_bar=False)}
        with pytest.raises(PreflightError, match=match) as err:
            stage.generate(spec, store, ["00000"], engine, **quiet)
        assert "\n" not in str(err.value)
        with pytest.raises(PreflightError, match=match):
            estimate(spec, store, engine, canary_prompts=2, usd_per_prompt_token=0.0,
                     usd_per_completion_token=0.0, **quiet)  # fmt: skip
    finally:
        server.stop()
    assert server.received == 0


def test_a_missing_target_tokenizer_stops_generation_and_the_estimate_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("EAGLE_DATA_TARGET_TOKENIZER", str(tmp_path / "no-such-tokenizer"))
    spec = spec_for_tests(target="qwen3")
    _refused_before_any_request(ShardStore(str(tmp_path)), spec, r"b7_sharegpt: before any request: "
                                r"target qwen3: cannot fetch tokenizer .*set EAGLE_DATA_TARGET_TOKENIZER")  # fmt: skip


def test_an_output_root_that_takes_no_write_stops_generation_before_any_request(tmp_path: Path):
    (tmp_path / "out").write_text("a file where the output folder should be")
    store = ShardStore(str(tmp_path / "out"))
    _refused_before_any_request(store, spec_for_tests(), r"before any request: cannot write .* is not a folder")


def test_an_unreadable_benchmark_file_stops_generation_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "mt_bench.jsonl").write_bytes(b"")
    user = tmp_path / "catalog.toml"
    user.write_text(f'[drafter.decontamination]\nfolder = "{tmp_path / "bench"}"\n')
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    _refused_before_any_request(ShardStore(str(tmp_path / "out")), spec_for_tests(),
                                r"before any request: benchmark mt_bench: .*mt_bench.jsonl is empty")  # fmt: skip


def test_generation_preflight_reads_the_benchmarks_but_loads_no_decontamination_index(tmp_path: Path):
    """The benchmark files are read before any request (an unreadable one stops the run, above), but the n-gram
    index is validation's: generation's pre-flight neither builds it nor imports the module that does."""
    code = (
        "import sys\n"
        "from eagle_data.standins.openai_fake import spec_for_tests\n"
        "from eagle_data.stages.preflight import preflight\n"
        "from eagle_data.storage import ShardStore\n"
        f"preflight(spec_for_tests(), ShardStore({str(tmp_path)!r}), 'm', 'openai')\n"
        "print(sorted(m for m in sys.modules if m.rsplit('.', 1)[-1] == 'decontam'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
