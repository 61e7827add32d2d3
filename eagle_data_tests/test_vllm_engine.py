"""The vllm kind: the OpenAI-compatible client asking for token ids (`return_token_ids`); the reply's own ids
and the prompt ids the server rendered land in the generation rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.storage import ShardStore
from eagle_data.targets.vocab import qwen_tokenizer
from eagle_data.types import FatalError, Message
from eagle_data_tests.servers.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests

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
