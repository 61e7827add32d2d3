"""The vllm kind: the OpenAI-compatible client asking for token ids (`return_token_ids`); the reply's own ids
and the prompt ids the server rendered land in the generation rows, and the pre-flight checks the server's chat
template on one prompt before anything else is sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle_data import layout
from eagle_data.catalog import DatasetSpec, Generation, load_catalog
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.stages.estimate import estimate
from eagle_data.stages.preflight import PreflightError
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.targets.vocab import qwen_tokenizer
from eagle_data.types import Engine, FatalError, Message
from eagle_data_tests import fixtures_stages as stage

DS = "b7_sharegpt"
FAST = RunnerSettings(backoff_base_s=0.0, backoff_cap_s=0.0, max_attempts=2, progress_bar=False)


def chatml(messages: list[Message]) -> str:
    """Qwen3's generation prompt for a conversation (what a vLLM server of that model renders)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def test_a_vllm_run_records_the_replys_own_ids_and_the_prompt_ids_the_server_used(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    engine = make_engine("vllm", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
    assert engine.config()["return_token_ids"] is True  # in the resume key: ids-bearing rows are their own
    store = ShardStore(str(tmp_path))
    run_generation(engine, spec_for_tests(), prompt_shards(1, 4, turns=2), store, settings=FAST, log=lambda _: None)
    rows = store.read_shard(DS, DS, "00000")
    assert rows["status"].to_list() == ["ok"] * 4 and rows["engine"].to_list() == ["vllm"] * 4
    assert [body["return_token_ids"] for body in server.settings.values()] == [True] * 8
    tokenizer = qwen_tokenizer()
    for row in rows.iter_rows(named=True):
        sent = [{"role": m["role"], "content": m["content"]} for m in row["messages"][:-1]]
        assert row["prompt_ids"] == tokenizer.encode(chatml(sent), add_special_tokens=False).ids
        assert row["output_ids"] == row["messages"][-1]["output_ids"]
        reply = tokenizer.decode(row["output_ids"], skip_special_tokens=False)
        assert reply == f"<think>\n{row['reasoning']}\n</think>\n\n{row['content']}<|im_end|>"
        assert all(m["output_ids"] for m in row["messages"] if m["role"] == "assistant")  # every regenerated turn


def test_a_server_that_ignores_return_token_ids_stops_the_run_in_one_line(server: FakeOpenAI, tmp_path: Path) -> None:
    server.faults = Faults(ignore_token_ids=True)
    engine = make_engine("vllm", base_url=f"http://127.0.0.1:{server.port}/v1", model="m")
    store = ShardStore(str(tmp_path))
    with pytest.raises(FatalError, match="answered without token_ids: it ignores return_token_ids") as err:
        run_generation(engine, spec_for_tests(), prompt_shards(1, 3), store, settings=FAST, log=lambda _: None)
    assert "\n" not in str(err.value) and err.value.kind == "config"
    assert set(store.read_shard(DS, DS, "00000")["status"]) == {"failed"}


def test_the_vllm_kind_needs_a_base_url() -> None:
    with pytest.raises(FatalError, match=r"^engine vllm needs a base URL: set EAGLE_DATA_BASE_URL"):
        make_engine("vllm", model="m")


# The server's chat template, checked before generation: the pre-flight renders one prompt on the server.
PREAMBLE = "Cutting Knowledge Date: December 2023\n\n"  # another template's system preamble (Llama 3.1's dates)
QUIET = {"log": lambda _: None, "settings": RunnerSettings(progress_bar=False)}


def demo_dataset(store: ShardStore, **update: Any) -> DatasetSpec:
    """The demo entry (bundled sample prompts, system turns in some) for Qwen3 with thinking on, as the fake vLLM
    serves it; its first two prompt shards written."""
    demo = load_catalog(profile="demo")["b7_sharegpt"]
    spec = demo.model_copy(update={"target": "qwen3-test", "token_budget": 0, "cost_budget_usd": 0.0,
                                   "generation": Generation(max_tokens=64), **update})  # fmt: skip
    stage.write_prompts(spec, store, ["00000", "00001"], warn=lambda _: None)
    return spec


def vllm(server: FakeOpenAI) -> Engine:
    return make_engine("vllm", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)


def test_a_server_with_another_chat_template_stops_generation_and_the_estimate_after_one_request(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.faults = Faults(system_preamble=PREAMBLE)
    store = ShardStore(str(tmp_path))
    spec, engine = demo_dataset(store), vllm(server)
    match = (r"^b7_sharegpt: the server renders prompts with another chat template than target qwen3-test: first "
             r"difference at token \d+ of \d+ \(server '[^']*Cutting[^']*', ours '.+'; the server's prompt is \d+ "
             r"tokens\); set `target` to the served "
             r"model's profile or fix the server's template \(check_server_template = false")  # fmt: skip
    with pytest.raises(PreflightError, match=match) as err:
        stage.generate(spec, store, ["00000", "00001"], engine, **QUIET)
    assert "\n" not in str(err.value)
    assert server.received == 1 and dict(server.requests) == {"template-check#1": 1}  # one request, before any prompt
    assert server.settings["template-check#1"]["max_tokens"] == 1 and server.billed_usd > 0
    with pytest.raises(PreflightError, match=match):
        estimate(spec, store, engine, canary_prompts=4, usd_per_prompt_token=0.0,
                 usd_per_completion_token=0.0, **QUIET)  # fmt: skip
    assert server.received == 2 and not store.shard_exists(spec.name, spec.name, "00000")


def test_forced_past_the_check_every_row_of_another_template_is_prompt_mismatch_and_blocks(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.faults = Faults(system_preamble=PREAMBLE)
    store = ShardStore(str(tmp_path))
    spec, lines = demo_dataset(store, check_server_template=False), list[str]()
    stage.generate(spec, store, ["00000"], vllm(server), log=lines.append, settings=QUIET["settings"])
    assert "template-check#1" not in server.requests
    assert lines[0].startswith("WARNING b7_sharegpt: the server's chat template is not checked")
    record = stage.validate(spec, store, ["00000"], workers=1, log=lambda _: None).records["00000"]
    rows = store.read_shard(spec.name, layout.validated_asset(spec.name), "00000")
    assert rows.height == 10 and rows["verdict"].to_list() == ["prompt_mismatch"] * 10
    structure = next(result for result in record.results if result.name == "token_structure")
    assert structure.blocking and not structure.passed


def test_a_server_with_the_targets_template_passes_the_check_and_its_rows_pass(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    store, lines = ShardStore(str(tmp_path)), list[str]()
    spec = demo_dataset(store)
    stage.generate(spec, store, ["00000"], vllm(server), log=lines.append, settings=QUIET["settings"])
    assert server.requests["template-check#1"] == 1
    assert "b7_sharegpt: the server renders prompts as target qwen3-test does (checked on one prompt)" in lines
    record = stage.validate(spec, store, ["00000"], workers=1, log=lambda _: None).records["00000"]
    rows = store.read_shard(spec.name, layout.validated_asset(spec.name), "00000")
    assert rows["prompt_ok"].to_list() == [True] * 10 and rows["verdict"].to_list() == ["pass"] * 10
    assert all(result.passed for result in record.results if result.blocking)


def test_a_server_that_reports_no_prompt_ids_stops_generation_at_the_check(server: FakeOpenAI, tmp_path: Path) -> None:
    server.faults = Faults(ignore_token_ids=True)
    store = ShardStore(str(tmp_path))
    spec = demo_dataset(store)
    match = r"^b7_sharegpt: the server's chat template could not be checked: the server answered without token_ids"
    with pytest.raises(PreflightError, match=match) as err:
        stage.generate(spec, store, ["00000"], vllm(server), **QUIET)
    assert "\n" not in str(err.value) and server.received == 1


def test_forced_past_the_check_the_warning_names_the_verdict_a_row_of_another_template_gets(
    tmp_path: Path, server: FakeOpenAI
) -> None:
    """Issue 43.7: the warning promised prompt_mismatch while rows of another template, whose reply also puts its
    control tokens elsewhere (structure_ok False too), were judged bad_structure."""
    from eagle_data.catalog import Checks
    from eagle_data.quality import row_verdicts
    from eagle_data.stages.preflight import check_server_template
    from eagle_data_tests.fixtures_quality import clean_frame, set_rows

    spec, lines = demo_dataset(ShardStore(str(tmp_path)), check_server_template=False), list[str]()
    check_server_template(spec, vllm(server), {}, lines.append)
    frame = clean_frame().with_columns(prompt_ok=pl.lit(True))  # a server that reports its prompt ids
    row = set_rows(frame, [0], prompt_ok=False, structure_ok=False, roundtrip_ok=False)
    verdict = row_verdicts(row, Checks(), thinking=True)["verdict"][0]
    assert verdict == "prompt_mismatch" and f"set aside at validation as {verdict} " in lines[0]
    assert server.received == 0  # the warning costs no request
