"""Token ids, loss masks and verification for Qwen3 and Kimi layouts, on real offline vocabularies.

Golden files (eagle_data_tests/golden/<profile>/<scenario>.json) pin input_ids and loss_mask per
scenario; regenerate them with EAGLE_DATA_UPDATE_GOLDEN=1 after a deliberate format change.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle_data.targets import Target, build_training_rows, load_target
from eagle_data.targets.rows import MESSAGE_DTYPE
from eagle_data.targets.vocab import kimi_test_tokenizer, qwen_tokenizer

GOLDEN = Path(__file__).parents[1] / "golden"
SCENARIOS: list[dict[str, Any]] = json.loads((GOLDEN / "scenarios.json").read_text())
PROFILES = ("qwen3-test", "kimi-test")
UPDATE = os.environ.get("EAGLE_DATA_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="session", params=PROFILES)
def target(request: pytest.FixtureRequest) -> Target:
    return load_target(request.param)


def frame(scenarios: list[dict[str, Any]], **extra: list[Any]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "prompt_id": [s["name"] for s in scenarios],
            "dataset": "test",
            "status": ["truncated" if s["finish_reason"] == "length" else "ok" for s in scenarios],
            "finish_reason": [s["finish_reason"] for s in scenarios],
            "messages": pl.Series([s["messages"] for s in scenarios], dtype=pl.List(MESSAGE_DTYPE)),
            **extra,
        }
    )


def build(target: Target, scenario: dict[str, Any], **extra: list[Any]) -> dict[str, Any]:
    out = build_training_rows(
        target,
        frame([scenario], **extra),
        thinking=scenario["thinking"],
        mask_empty_think=scenario["mask_empty_think"],
    )
    return out.row(0, named=True)


def decode(target: Target, ids: list[int]) -> str:
    return target.text_encoder.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_golden_ids_and_mask(target: Target, scenario: dict[str, Any]) -> None:
    row = build(target, scenario)
    got = {
        "text": decode(target, row["input_ids"]),
        "trained": decode(target, [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]),
        "input_ids": row["input_ids"],
        "loss_mask": row["loss_mask"],
    }
    path = GOLDEN / target.name / f"{scenario['name']}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, ensure_ascii=False) + "\n")
    assert json.loads(path.read_text()) == got


@pytest.mark.parametrize("byte_table", [True, False], ids=["byte-table", "tokenizer-decode"])
def test_mixed_set_round_trips_exactly(target: Target, byte_table: bool) -> None:
    target = target if byte_table else dataclasses.replace(target, token_bytes=None)
    rows = pl.concat(
        build_training_rows(target, frame([s]), thinking=s["thinking"], mask_empty_think=s["mask_empty_think"])
        for s in SCENARIOS
    )
    assert rows.height == len(SCENARIOS)
    for flag in ("roundtrip_ok", "prefix_ok", "structure_ok", "eot_ok"):
        assert rows[flag].all(), rows.filter(~pl.col(flag))["prompt_id"].to_list()


# The assistant tokens each scenario trains on, written out by hand per format (not via the renderer).
def expected_trained_texts(profile: str, scenario: dict[str, Any]) -> list[str]:
    msgs, thinking = scenario["messages"], scenario["thinking"]
    truncated, hide_empty = scenario["finish_reason"] == "length", scenario["mask_empty_think"]
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    texts = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or ("reasoning" not in m and i != len(msgs) - 1):
            continue
        r, c, final = m.get("reasoning") or "", m["content"], i == len(msgs) - 1
        end = "" if final and truncated else "<|im_end|>"
        if profile == "qwen3-test":
            if final and thinking:
                r, c = r.strip("\n"), c.lstrip("\n")
                think = "" if hide_empty and not r else f"<think>\n{r}\n</think>"
                text = f"{think}\n\n{c}{end}" if c or not truncated else f"<think>\n{r}"
            elif i > last_user and r:
                text = f"<think>\n{r.strip(chr(10))}\n</think>\n\n{c.lstrip(chr(10))}{end}"
            else:
                text = f"{c}{end}"
        elif final:
            think = "" if hide_empty and not r else f"{r}</think>"
            text = (f"{think}{c}{end}" if c or not truncated else r) if thinking else f"{c}{end}"
        else:
            text = f"{'' if hide_empty else '<think></think>'}{c}{end}"
        texts.append(text)
    return texts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_loss_mask_counts_every_assistant_token(target: Target, scenario: dict[str, Any]) -> None:
    plain = qwen_tokenizer() if target.name == "qwen3-test" else kimi_test_tokenizer()
    expected = sum(len(plain.encode(t).ids) for t in expected_trained_texts(target.name, scenario))
    row = build(target, scenario)
    assert row["loss_tokens"] == sum(row["loss_mask"]) == expected


def test_kimi_assistant_turns_end_with_163586() -> None:
    kimi = load_target("kimi-test")
    headers = {163587, 163588, 163594}  # user, assistant, system
    for scenario in SCENARIOS:
        ids = build(kimi, scenario)["input_ids"]
        starts = [i for i, t in enumerate(ids) if t == 163588]
        ends = [next((j for j in range(s + 1, len(ids)) if ids[j] in headers), len(ids)) for s in starts]
        closing = [ids[e - 1] for e in ends]
        if scenario["finish_reason"] == "length":
            assert closing[-1] != 163586
            closing = closing[:-1]
        assert closing == [163586] * len(closing), scenario["name"]
        msgs = scenario["messages"]
        turns = len(msgs) + (msgs[0]["role"] != "system") - (scenario["finish_reason"] == "length")
        assert ids.count(163586) == turns


def test_user_typed_special_tokens_stay_plain_text(target: Target) -> None:
    scenario = next(s for s in SCENARIOS if s["name"] == "user_special_tokens")
    row = build(target, scenario)
    typed = scenario["messages"][0]["content"]
    assert row["special_in_text"] == len(target.control_pattern.findall(typed)) >= 3
    eot = target.eot_id
    turns = len(scenario["messages"]) + (target.name == "kimi-test")  # Kimi adds its default system turn
    assert row["input_ids"].count(eot) == turns  # a typed "<|im_end|>" never becomes the control id
    assert row["structure_ok"] and row["roundtrip_ok"]


def test_control_ids_from_text_are_flagged(target: Target) -> None:
    """An encoder that parses special-token strings (the mistake this room guards against) fails the row."""
    scenario = next(s for s in SCENARIOS if s["name"] == "user_special_tokens")
    parsing = dataclasses.replace(target, text_encoder=target.tokenizer)
    assert not build(parsing, scenario)["structure_ok"]


def test_special_token_string_in_model_text_is_counted(target: Target) -> None:
    scenario = {
        **SCENARIOS[2],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "I write </think> and <|im_end|> literally.",
                "reasoning": "<think> again",
            },
        ],
    }
    row = build(target, scenario)
    assert row["special_in_text"] == 3 and row["structure_ok"] and row["roundtrip_ok"]


def test_truncated_reply_has_no_end_of_turn(target: Target) -> None:
    for name in ("truncated", "truncated_in_reasoning"):
        scenario = next(s for s in SCENARIOS if s["name"] == name)
        row = build(target, scenario)
        assert row["input_ids"][-1] != target.eot_id and row["loss_mask"][-1] == 1
        assert row["eot_ok"] and row["roundtrip_ok"]
    assert "</think>" not in decode(target, row["input_ids"])  # cut off while thinking: never closed


def test_output_ids_are_used_and_cross_checked(target: Target) -> None:
    scenario = next(s for s in SCENARIOS if s["name"] == "multilingual_code")
    text_row = build(target, scenario)
    prompt_len = text_row["loss_mask"].index(1)  # single-turn: training starts where the model does
    completion = text_row["input_ids"][prompt_len:]
    if target.name == "qwen3-test":
        completion = completion[:-1]  # the "\n" after <|im_end|> is template, not model output
    same = build(target, scenario, output_ids=[completion[:-1]])  # engine left the stop token out
    assert same["ids_match"] is True and same["input_ids"] == text_row["input_ids"]
    assert text_row["ids_match"] is None
    # The model spelled a word with different tokens: its own ids win, the text still round-trips.
    word, pieces = next((i, split) for i, t in enumerate(completion) if (split := split_token(target, t)))
    own = [*completion[:word], *pieces, *completion[word + 1 :]]
    other = build(target, scenario, output_ids=[own])
    assert other["ids_match"] is False and other["roundtrip_ok"] and other["structure_ok"]
    assert other["input_ids"][prompt_len : prompt_len + len(own)] == own
    # A control token the template never puts there is flagged.
    stray = build(target, scenario, output_ids=[[*completion[:3], target.template.header["user"][0], *completion[3:]]])
    assert stray["ids_match"] is False and not stray["structure_ok"]
    # Stopped on another control token (Qwen <|endoftext|>, Kimi [EOS]): the turn is not closed by end-of-turn.
    other_stop = target.tokenizer.token_to_id("<|endoftext|>" if target.name == "qwen3-test" else "[EOS]")
    wrong_end = build(target, scenario, output_ids=[[*completion[:-1], other_stop]])
    assert not wrong_end["eot_ok"] and not wrong_end["structure_ok"] and wrong_end["ids_match"] is False
    # Tokens that say something else than the text: the round trip catches it.
    hello = target.text_encoder.encode("Something else entirely.").ids
    assert not build(target, scenario, output_ids=[hello])["roundtrip_ok"]


def split_token(target: Target, token: int) -> list[int] | None:
    """The same bytes as two tokens (first character, rest), when both exist in the vocabulary."""
    text = target.text_encoder.id_to_token(token)
    parts = [target.text_encoder.token_to_id(p) for p in (text[:1], text[1:])] if len(text) >= 3 else []
    return parts if len(parts) == 2 and None not in parts else None


def test_failed_rows_get_no_ids_and_bad_conversations_an_error(target: Target) -> None:
    gens = frame(SCENARIOS[:3]).with_columns(
        status=pl.Series(["failed", "skipped_budget", "ok"]),
        messages=pl.Series([[], [], [{"role": "user", "content": "no reply"}]], dtype=pl.List(MESSAGE_DTYPE)),
    )
    rows = build_training_rows(target, gens, thinking=True)
    assert rows["input_ids"].list.len().to_list() == [0, 0, 0]
    assert rows["roundtrip_ok"].to_list() == [None, None, False]
    assert "does not end with an assistant turn" in rows["target_error"][2]
    assert rows["status"].to_list() == ["failed", "skipped_budget", "ok"]


def test_server_prompt_ids_are_checked_and_a_mismatch_is_a_structure_verdict(target: Target) -> None:
    from eagle_data.catalog import Checks
    from eagle_data.quality.verdicts import STRUCTURE_REASONS, row_verdicts
    from eagle_data.targets import prompt_ids, prompt_ids_match

    plain, typed = (next(s for s in SCENARIOS if s["name"] == n) for n in ("multilingual_code", "user_special_tokens"))
    ours = prompt_ids(target, plain["messages"][:-1], thinking=True)
    typed_prompt = typed["messages"][:-1]
    # A server that renders text and tokenizes it with control-token parsing on: the user's `<|im_end|>` etc.
    parsed = target.tokenizer.encode(decode(target, prompt_ids(target, typed_prompt, thinking=True))).ids
    assert prompt_ids_match(target, plain["messages"][:-1], ours, thinking=True)
    assert not prompt_ids_match(target, typed_prompt, parsed, thinking=True)
    scenarios = [plain, typed, plain]
    rows = build_training_rows(
        target,
        frame(scenarios, prompt_ids=pl.Series([ours, parsed, None], dtype=pl.List(pl.Int32))),
        thinking=True,
    ).with_columns(
        content=pl.Series([s["messages"][-1]["content"] for s in scenarios]),
        reasoning=pl.Series([s["messages"][-1]["reasoning"] for s in scenarios]),
        completion_tokens=pl.lit(None, pl.Int64),  # no engine count: token accounting is not judged here
    )
    assert rows["prompt_ok"].to_list() == [True, False, None]
    verdicts = row_verdicts(rows, Checks(), thinking=True)["verdict"].to_list()
    assert verdicts == ["pass", "prompt_mismatch", "pass"]
    assert "prompt_mismatch" in STRUCTURE_REASONS  # counted by the blocking token_structure check


def test_a_prompt_difference_names_the_first_differing_token_and_what_each_side_has_there(target: Target) -> None:
    from eagle_data.targets import prompt_difference, prompt_ids

    prompt = next(s for s in SCENARIOS if s["name"] == "multilingual_code")["messages"][:-1]
    ours = prompt_ids(target, prompt, thinking=True)
    think = next(i for i, text in target.token_text.items() if text == "<think>")
    assert prompt_difference(target, prompt, ours, thinking=True) == ""
    opened = prompt_difference(target, prompt, [*ours, think], thinking=True)  # a template opening the think block
    assert opened == (f"first difference at token {len(ours)} of {len(ours)} (server '<think>', ours end of prompt; "
                      f"the server's prompt is {len(ours) + 1} tokens)")
    changed = prompt_difference(target, prompt, [*ours[:2], think, *ours[2:]], thinking=True)
    assert changed.startswith(f"first difference at token 2 of {len(ours)} (server '<think>")
    assert changed.endswith(f", ours {decode(target, ours[2:6])!r}; the server's prompt is {len(ours) + 1} tokens)")
