"""The sampled tokens' own log-probabilities, asked for in the generation request itself (issue #41, item 2c): the
OpenAI chat format parsed (OpenAI's and SGLang's order, vLLM's with the sampled token listed first), each row's
figures stored, summed per shard into the validated asset's metadata and its report, and a server that ignores the
request stopped on its first answer. Against the OpenAI-compatible stand-in on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_data import layout
from eagle_data.catalog import OnPolicy
from eagle_data.engines import EngineSettings, build_engine, make_engine
from eagle_data.engines.openai_protocol import parse_response
from eagle_data.quality import sampled
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.resultlog import resume_key
from eagle_data.standins import model_logprobs
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.standins.reply_shapes import logprob_entry
from eagle_data.storage import ShardStore
from eagle_data.types import FatalError
from eagle_data_tests import fixtures_stages as stage
from eagle_data_tests.unit.test_vllm_engine import QUIET, demo_dataset

DS = "b7_sharegpt"
FAST = RunnerSettings(backoff_base_s=0.0, backoff_cap_s=0.0, max_attempts=2, progress_bar=False)
K = 3


def answer(content: list[dict] | None) -> bytes:
    choice = {"finish_reason": "stop", "message": {"content": "two words"}}
    return json.dumps({"choices": [{**choice, **({"logprobs": {"content": content}} if content is not None else {})}],
                       "usage": {"completion_tokens": 2}}).encode()  # fmt: skip


def token(text: str, value: float, listed: list[float]) -> dict:
    return {**logprob_entry(text, value), "top_logprobs": [logprob_entry(f"t{i}", v) for i, v in enumerate(listed)]}


def test_ranks_follow_the_listed_log_probabilities_in_any_order_and_a_missing_value_is_left_out() -> None:
    content = [
        token("a", -0.1, [-0.1, -2.0, -3.0]),  # OpenAI / SGLang: most likely first, the sampled token the first
        token("b", -2.0, [-0.5, -2.0, -3.0]),  # ... the second
        token("c", -5.0, [-0.5, -1.0, -2.0]),  # ... not among the k: rank k - 1 or beyond
        token("d", -4.0, [-4.0, -0.3, -0.9]),  # vLLM: the sampled token first, then the k - 1 most likely others
        token("e", -9999.0, []),  # vLLM's placeholder of a token without a value
    ]
    done = parse_response(200, answer(content), top_logprobs=K)
    assert done.sampled_logprobs == {"tokens": 4, "logprob": pytest.approx(-11.1), "ranks": [1, 1, 2]}
    assert parse_response(200, answer(content)).sampled_logprobs is None  # not asked: not read


def test_an_answer_without_the_logprobs_asked_for_is_a_one_line_error() -> None:
    with pytest.raises(FatalError, match=r"^the server answered without logprobs: it ignores") as err:
        parse_response(200, answer(None), top_logprobs=K)
    assert "\n" not in str(err.value) and err.value.kind == "config"
    assert parse_response(200, answer([]), top_logprobs=K).sampled_logprobs == {"tokens": 0, "logprob": 0.0,
                                                                                "ranks": [0, 0, 0]}  # fmt: skip


def test_the_catalog_setting_asks_in_the_same_request_and_leaves_the_resume_key_alone(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    spec = spec_for_tests(on_policy=OnPolicy(sampled_logprobs=True, top_logprobs=K))
    settings = EngineSettings(kind="vllm", model="m", base_url=f"http://127.0.0.1:{server.port}/v1")
    asking, plain = build_engine(settings, spec), build_engine(settings, spec_for_tests())
    assert asking.config() == plain.config()  # the same replies: rows stored before are reused as they are
    assert resume_key(asking.config(), spec) == resume_key(plain.config(), spec_for_tests())
    store = ShardStore(str(tmp_path))
    run_generation(asking, spec, prompt_shards(1, 3, turns=2), store, settings=FAST, log=lambda _: None)
    assert server.received == 6  # one request per reply: the log-probabilities cost no extra request
    assert {(body["logprobs"], body["top_logprobs"]) for body in server.settings.values()} == {(True, K)}
    for row in store.read_shard(DS, DS, "00000").iter_rows(named=True):
        replies = [m["output_ids"] for m in row["messages"] if m["role"] == "assistant"]  # think blocks included
        second = sum(len(ids) // 4 for ids in replies)  # the stand-in's every fourth token is its second choice
        tokens = sum(map(len, replies))
        assert row[sampled.COLUMN] == {"tokens": tokens, "logprob": pytest.approx(-0.25 * tokens - second),
                                       "ranks": [tokens - second, second, 0]}  # fmt: skip


def test_a_server_that_ignores_logprobs_stops_the_run_on_its_first_answer(server: FakeOpenAI, tmp_path: Path) -> None:
    server.faults = Faults(ignore_logprobs=True)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", top_logprobs=K)
    one_at_a_time = RunnerSettings(max_in_flight=1, initial_in_flight=1, min_in_flight=1, progress_bar=False)
    store = ShardStore(str(tmp_path))
    with pytest.raises(FatalError, match=r"answered without logprobs: it ignores the chat request's logprobs") as err:
        run_generation(engine, spec_for_tests(), prompt_shards(1, 6), store, settings=one_at_a_time, log=print)
    assert "\n" not in str(err.value) and server.received == 1  # the first answer stops it: nothing more is paid


def test_with_a_model_the_stand_in_answers_its_real_values_and_the_shard_metadata_sums_them(
    server: FakeOpenAI, tmp_path: Path, demo_model: Path
) -> None:
    server.faults = Faults(score_model=str(demo_model))
    store = ShardStore(str(tmp_path))
    spec = demo_dataset(store, on_policy=OnPolicy(sampled_logprobs=True, top_logprobs=K, sample_rows=0))
    engine = make_engine("vllm", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64,
                         top_logprobs=K)  # fmt: skip
    stage.generate(spec, store, ["00000"], engine, **QUIET)
    rows = store.read_shard(DS, DS, "00000").filter(status="ok")
    row = rows.row(0, named=True)
    expected = model_logprobs.logprobs(str(demo_model), [*row["prompt_ids"], *row["output_ids"]])
    reply = range(len(row["prompt_ids"]), len(row["prompt_ids"]) + len(row["output_ids"]))
    ids = [*row["prompt_ids"], *row["output_ids"]]
    assert row[sampled.COLUMN]["tokens"] == len(row["output_ids"])
    assert row[sampled.COLUMN]["logprob"] == pytest.approx(sum(float(expected[t, ids[t]]) for t in reply), abs=1e-3)
    numbers = stage.validate(spec, store, ["00000"], workers=1, log=lambda _: None).records["00000"].numbers
    assert numbers[f"{sampled.PREFIX}rows"] == rows.height
    assert numbers[f"{sampled.PREFIX}tokens"] == sum(r["tokens"] for r in rows[sampled.COLUMN].to_list())
    assert numbers[f"{sampled.PREFIX}top1"] == sum(r["ranks"][0] for r in rows[sampled.COLUMN].to_list())
    assert 0 <= numbers[f"{sampled.PREFIX}agreement"] <= 1
    page = store.read_bytes(layout.quality_page(spec.name, "00000")).decode()
    assert "Sampled tokens, as the engine reported them" in page
