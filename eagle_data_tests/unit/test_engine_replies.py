"""Replies: reasoning read from every shape servers use; an empty reply is a failed attempt, never a result;
resume reuses only usable replies; engine-side rejections can be re-requested."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import pytest

from eagle_data import layout
from eagle_data.engines import make_engine
from eagle_data.engines.replies import reply_text, split_ids, split_text
from eagle_data.quality.verdicts import ENGINE_SIDE_REJECTIONS
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.resultlog import ResultLog, resume_key
from eagle_data.runner.rows import build_row, to_frame
from eagle_data.runner.run import NothingAnswered
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.standins.reply_shapes import fake_reply
from eagle_data.storage import ShardStore
from eagle_data.targets import profile, reasoning, reasoning_markers
from eagle_data.targets.reasoning import THINK_TAGS
from eagle_data.targets.vocab import qwen_tokenizer
from eagle_data_tests import fixtures_stages as stage

DS = "b7_sharegpt"
FAST = RunnerSettings(backoff_base_s=0.0, backoff_cap_s=0.0, max_attempts=3, progress_bar=False)


def generate(server: FakeOpenAI, root: Path, shards: dict[str, pl.DataFrame], lines: list[str] | None = None) -> None:
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
    log = lines.append if lines is not None else (lambda _: None)
    run_generation(engine, spec_for_tests(), shards, ShardStore(str(root)), settings=FAST, log=log)


def shard(root: Path, partition: str = "00000") -> pl.DataFrame:
    return ShardStore(str(root)).read_shard(DS, DS, partition)


@pytest.mark.parametrize("shape", ["split", "details", "reasoning_content", "think_inline"])
def test_reasoning_is_read_from_every_reply_shape_and_content_keeps_only_the_answer(
    server: FakeOpenAI, tmp_path: Path, shape: str
) -> None:
    server.faults = Faults(shape=shape, reply_tokens=(3, 3))
    generate(server, tmp_path, prompt_shards(1, 4))
    rows = shard(tmp_path)
    summary = " (summary)" if shape == "details" else ""  # the summary part follows the text part
    assert rows["status"].to_list() == ["ok"] * 4
    assert rows["content"].to_list() == [fake_reply(f"{pid}#1", 3) for pid in rows["prompt_id"]]
    assert rows["reasoning"].to_list() == [f"think {pid}#1{summary}" for pid in rows["prompt_id"]]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("<think>\nr\n</think>\n\nanswer", ("r", "answer")),
        ("r\n</think>\n\nanswer", ("r", "answer")),  # the template opened the block in the prompt
        ("<think>\ncut off while thinking", ("cut off while thinking", "")),
        ("plain answer about <think> tags", ("", "plain answer about <think> tags")),
    ],
)
def test_think_blocks_inside_content_move_to_reasoning(content: str, expected: tuple[str, str]) -> None:
    assert split_text(content, THINK_TAGS) == expected
    assert split_text(content, reasoning_markers("qwen3")) == expected


def test_the_split_follows_the_target_profile_markers_and_strip_rules() -> None:
    kimi = reasoning_markers("kimi-k2.5")  # Kimi's format strips nothing around its think block
    assert kimi is not None and (kimi.open_id, kimi.close_id) == (163606, 163607)
    assert split_text("<think>\nr\n</think>\nanswer", kimi) == ("\nr\n", "\nanswer")
    assert split_text("<think>r</think>answer", None) == ("", "<think>r</think>answer")  # a format without blocks
    assert split_text("answer, then r</think> and <think>", THINK_TAGS) == ("answer, then r", " and <think>")
    assert split_text("a <think> mention</think>", THINK_TAGS) == ("", "a <think> mention</think>")


def test_text_and_ids_are_split_by_the_same_rule() -> None:
    """The same replies as text and as token ids split alike (SGLang and local split ids, servers text)."""
    markers, tokenizer = reasoning_markers("qwen3-test"), qwen_tokenizer()

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    for text in ("<think>\nr one\n</think>\n\nanswer", "r two\n</think>\n\nanswer", "<think>\ncut off",
                 "plain answer", "</think>answer", "x <think> y </think> z"):  # fmt: skip
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        reasoning, content, _ = split_ids(ids, markers, decode, cut_while_thinking=False)
        assert (reasoning, content) == split_text(text, markers), text


def test_a_parsed_reasoning_field_wins_and_nulls_read_as_empty() -> None:
    assert reply_text({"content": None, "reasoning": None, "reasoning_content": None}) == ("", "")
    assert reply_text({"content": "a", "reasoning": "", "reasoning_content": "r"}) == ("r", "a")
    parts = [{"type": "reasoning.encrypted", "data": "x"}]
    assert reply_text({"content": "a", "reasoning_details": parts}) == ("", "a")


@pytest.mark.parametrize(
    ("shape", "error"),
    [
        ("null_content", "empty_reply: no content or reasoning"),  # the model said nothing
        ("special_only", "lost_text: 0 bytes of text (finish_reason length"),  # cut mid-reply: the server dropped it
    ],
)
def test_an_empty_reply_is_asked_again_once_then_recorded_failed_never_ok(
    server: FakeOpenAI, tmp_path: Path, shape: str, error: str
) -> None:
    """A billed empty reply is not an outage: asked again `breaker.empty_retries` (1) times, not max_attempts."""
    server.faults = Faults(shape=shape)
    lines: list[str] = []
    with pytest.raises(NothingAnswered):
        generate(server, tmp_path, prompt_shards(1, 5), lines)
    rows = shard(tmp_path)
    assert rows["status"].to_list() == ["failed"] * 5
    assert all(text.startswith(error) for text in rows["error"]), rows["error"].to_list()
    assert rows["attempts"].to_list() == [2] * 5
    assert server.received == 5 * 2
    assert any(f"first {error.split(':')[0]} error" in line for line in lines)
    assert any("wasted: 10 replies, $" in line for line in lines)


def test_resume_re_requests_empty_replies_stored_as_ok_by_older_versions(server: FakeOpenAI, tmp_path: Path) -> None:
    """#10 case 2: rows stored ok with `content: null` (finish "stop") were reused forever ("10 reused")."""
    shards = prompt_shards(1, 10)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
    key = resume_key(engine.config(), spec_for_tests())
    old = [
        {**build_row(pid, "ok", [], [], attempts=1, latency_s=0.1, error="", finished_at=time.time()),
         "dataset": DS, "config_hash": key.config_hash, "base_hash": key.base_hash, "max_tokens": key.max_tokens,
         "engine": "openai", "model": "m", "finish_reason": "stop"}
        for pid in shards["00000"]["prompt_id"]
    ]  # fmt: skip
    ShardStore(str(tmp_path)).write_shard(DS, DS, "00000", to_frame(old))
    lines: list[str] = []
    generate(server, tmp_path, shards, lines)
    assert server.received == 10
    assert any("(0 reused)" in line for line in lines)
    rows = shard(tmp_path)
    assert rows["status"].to_list() == ["ok"] * 10
    pairs = rows.select("prompt_id", "content").iter_rows()
    assert rows["content"].to_list() == [fake_reply(f"{pid}#1", len(text.split())) for pid, text in pairs]


def test_a_run_reuses_its_own_usable_replies(server: FakeOpenAI, tmp_path: Path) -> None:
    shards = prompt_shards(1, 6)
    generate(server, tmp_path, shards)
    sent = server.received
    lines: list[str] = []
    generate(server, tmp_path, shards, lines)
    assert server.received == sent and any("(6 reused)" in line for line in lines)
    assert ResultLog(ShardStore(str(tmp_path)), DS, "00000").load().height == 6


def test_retry_rejected_re_requests_only_rows_rejected_for_engine_side_reasons(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    spec, store = spec_for_tests(), ShardStore(str(tmp_path))
    prompts = prompt_shards(1, 6)["00000"]
    store.write_shard(DS, layout.prompts_asset(spec.name), "00000", prompts)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
    stage.generate(spec, store, ["00000"], engine, log=lambda _: None, settings=FAST)
    verdicts = ["short_loss", "empty_completion", "bad_structure", "pass", "truncated", "failed"]
    store.write_shard(DS, layout.validated_asset(spec.name), "00000", prompts.select("prompt_id").with_columns(
        pl.Series("verdict", verdicts)))  # fmt: skip
    assert server.received == 6
    stage.generate(spec, store, ["00000"], engine, log=lambda _: None, settings=FAST)
    assert server.received == 6  # without the switch every usable row is reused
    stage.generate(spec, store, ["00000"], engine, log=lambda _: None, settings=FAST, retry_rejected=True)
    assert server.received == 8
    again = {turn.split("#")[0] for turn, n in server.requests.items() if n == 2}
    assert again == set(prompts["prompt_id"][:2])
    assert "short_loss" in ENGINE_SIDE_REJECTIONS and "bad_structure" not in ENGINE_SIDE_REJECTIONS


def test_a_target_format_without_think_blocks_has_no_markers_and_its_replies_are_never_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = profile.TARGETS_PATH.read_text() + (
        '\n[formats.plain]\nsystem = "<|im_start|>system\\n"\nuser = "<|im_start|>user\\n"\n'
        'assistant = "<|im_start|>assistant\\n"\nend_of_turn = "<|im_end|>"\nafter_turn = "\\n"\nthink_open = ""\n'
        'think_close = ""\nhistory_think = "drop"\nprompt_opens_think = false\nstrip_reasoning = ""\n'
        'strip_content_start = ""\ndefault_system = ""\n\n[profiles.plain-test]\nformat = "plain"\n'
        'tokenizer = "builtin:qwen-dashscope"\ntokens = { "<|im_start|>" = 151644, "<|im_end|>" = 151645 }\n'
    )
    (tmp_path / "targets.toml").write_text(text)
    monkeypatch.setattr(reasoning, "read_profiles", lambda: profile.read_profiles(tmp_path / "targets.toml"))
    reasoning.reasoning_markers.cache_clear()
    try:
        assert reasoning.reasoning_markers("plain-test") is None
        assert reasoning.reasoning_markers("qwen3-test") is not None
    finally:
        reasoning.reasoning_markers.cache_clear()
    assert reply_text({"content": "<think>kept</think>as is"}, None) == ("", "<think>kept</think>as is")
