"""Target profiles: offline vocabularies, id checks on load, tokenizer sources (builtin, tokenizer.json, tiktoken)."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest

from eagle_data.stages.validation import validated_rows
from eagle_data.targets import TargetError, load_target, reasoning_markers, resolve_target, target_for_model
from eagle_data.targets.profile import Profile, read_profiles
from eagle_data.targets.target import build_target
from eagle_data.targets.vocab import KIMI_SPECIALS, kimi_test_tokenizer, qwen_ranks_file, qwen_tokenizer


@pytest.fixture(scope="session")
def profiles() -> dict[str, Profile]:
    return read_profiles()


def test_shipped_profiles_and_their_pairs_agree(profiles: dict[str, Profile]) -> None:
    assert {"qwen3", "kimi-k2.5", "demo", "qwen3-test", "kimi-test"} <= set(profiles)
    assert profiles["qwen3"].tokenizer == "Qwen/Qwen3-8B"
    assert profiles["kimi-k2.5"].tokenizer == "moonshotai/Kimi-K2.5"
    assert profiles["qwen3"].tokens == profiles["qwen3-test"].tokens == profiles["demo"].tokens
    assert profiles["kimi-k2.5"].tokens == profiles["kimi-test"].tokens
    assert profiles["kimi-k2.5"].tokens.items() <= KIMI_SPECIALS.items()
    assert profiles["qwen3-test"].tokens["<|im_end|>"] == 151645


@pytest.mark.parametrize(
    ("name", "vocab", "eot"),
    [("qwen3-test", 151669, 151645), ("kimi-test", 163840, 163586), ("llama3", 128256, 128009), ("mistral", 131072, 2)],
)
def test_offline_profiles_load_and_check_ids(name: str, vocab: int, eot: int) -> None:
    target = load_target(name)
    assert target.tokenizer.get_vocab_size() == vocab
    assert target.eot_id == eot
    assert all(target.tokenizer.token_to_id(t) == i for t, i in target.profile.tokens.items())
    assert load_target(name) is target  # cached per process


@pytest.mark.parametrize("name", ["qwen3-test", "kimi-test", "llama3", "mistral"])
def test_byte_table_decodes_exactly_like_the_tokenizer(name: str) -> None:
    target = load_target(name)
    rng = random.Random(0)
    size = target.tokenizer.get_vocab_size()
    for _ in range(300):  # random ids: control tokens, and byte tokens that split UTF-8 sequences
        ids = [rng.randrange(size) for _ in range(rng.randint(1, 40))]
        fast = b"".join(target.token_bytes[i] for i in ids).decode(errors="replace")
        assert fast == target.tokenizer.decode(ids, skip_special_tokens=False)


def test_demo_profile_is_qwen3_format_on_the_offline_vocab(profiles: dict[str, Profile]) -> None:
    assert profiles["demo"].format == profiles["qwen3"].format
    assert load_target("demo").tokenizer is qwen_tokenizer()


def test_kimi_test_vocab_has_kimi_ids_and_qwen_ranks() -> None:
    kimi, qwen = kimi_test_tokenizer(), qwen_tokenizer()
    assert {t: kimi.token_to_id(t) for t in KIMI_SPECIALS} == KIMI_SPECIALS
    assert kimi.id_to_token(163589) == "<|reserved_token_163589|>"
    assert kimi.token_to_id("<|im_start|>") is None  # a Qwen control token, not Kimi's
    text = "def f(x):\n    return x  # naïve 世界 🚀"
    assert kimi.encode(text).ids == qwen.encode(text).ids
    filler = kimi.id_to_token(151643)
    assert 151643 not in kimi.encode(filler).ids  # slots below Kimi's specials are unreachable


def test_mismatched_profile_refuses_with_one_line_error(profiles: dict[str, Profile]) -> None:
    wrong = profiles["kimi-test"].model_copy(update={"tokens": {**profiles["kimi-test"].tokens, "<|im_end|>": 163533}})
    with pytest.raises(TargetError) as err:
        build_target(wrong)
    message = str(err.value)
    assert "\n" not in message
    assert "'<|im_end|>' expected id 163533" in message and "has 163586" in message


def test_unknown_target_names_the_known_ones() -> None:
    with pytest.raises(TargetError, match=r"unknown target 'nope'.*kimi-test"):
        load_target("nope")


def test_template_text_holding_an_unlisted_control_token_is_refused(profiles: dict[str, Profile]) -> None:
    base = profiles["qwen3-test"]
    fmt = base.format.model_copy(update={"user": "<|im_start|>user<|box_start|>\n"})
    with pytest.raises(TargetError, match="box_start"):
        build_target(base.model_copy(update={"format": fmt}))


def test_env_override_loads_a_local_tokenizer_json(
    profiles: dict[str, Profile], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = json.loads(qwen_tokenizer().to_str())
    for token in spec["added_tokens"]:
        token["special"] = token["content"] not in ("<think>", "</think>")  # as Qwen3's tokenizer.json ships
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    monkeypatch.setenv("EAGLE_DATA_TARGET_TOKENIZER", str(tmp_path))
    target = build_target(profiles["qwen3"])
    assert target.tokenizer.encode("<think>").ids == [151667]
    assert 151667 not in target.text_encoder.encode("<think>").ids  # typed text stays text


def test_tiktoken_folder_converts_with_the_profiles_pattern(
    profiles: dict[str, Profile], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kimi's hub layout (tiktoken.model + tokenizer_config.json), built from Qwen's ranks padded to 163,584."""
    ranks = qwen_ranks_file().read_text().splitlines()
    fillers = [f"{base64.b64encode(f'<|unreachable_{i}|>'.encode()).decode()} {i}" for i in range(len(ranks), 163584)]
    (tmp_path / "tiktoken.model").write_text("\n".join(ranks + fillers) + "\n")
    decoder = {str(i): {"content": t, "special": True} for t, i in KIMI_SPECIALS.items()}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    monkeypatch.setenv("EAGLE_DATA_TARGET_TOKENIZER", str(tmp_path))
    target = build_target(profiles["kimi-k2.5"])
    assert target.tokenizer.get_vocab_size() == 163840
    assert target.tokenizer.id_to_token(163600) == "<|reserved_token_163600|>"
    pieces = target.tokenizer.pre_tokenizer.pre_tokenize_str("Hello世界")
    assert [p for p, _ in pieces] == ["Hello", "ä¸ĸçķĮ"]  # Kimi splits Han from Latin; Qwen's pattern would not


def test_unreachable_hub_tokenizer_is_one_clear_error(
    profiles: dict[str, Profile], monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never reach out from tests
    monkeypatch.setenv("EAGLE_DATA_TARGET_TOKENIZER", "nobody/no-such-tokenizer")
    with pytest.raises(TargetError, match=r"cannot fetch tokenizer 'nobody/no-such-tokenizer'.*EAGLE_DATA_TARGET"):
        build_target(profiles["qwen3"])


@pytest.mark.parametrize(
    ("model", "profile"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3"),
        ("meta-llama/llama-3.3-70b-instruct", "llama3"),
        ("meta-llama/llama-3.1-405b-instruct:free", "llama3"),
        ("Qwen/Qwen3-8B", "qwen3"),
        ("qwen/qwen3-235b-a22b", "qwen3"),
        ("moonshotai/Kimi-K2.5", "kimi-k2.5"),
        ("mistralai/Mistral-Nemo-Instruct-2407", "mistral"),
        ("meta-llama/Llama-3.1-8B", None),  # a base model: no chat template to train against
        ("openai/gpt-4o", None),
    ],
)
def test_served_model_ids_map_to_their_verified_profile(model: str, profile: str | None) -> None:
    assert target_for_model(model) == profile


def test_served_model_table_names_only_shipped_profiles(profiles: dict[str, Profile]) -> None:
    from eagle_data.targets.profile import served_models

    assert set(served_models().values()) <= set(profiles)


def test_auto_target_follows_the_served_model_and_refuses_an_unknown_one() -> None:
    assert resolve_target("qwen3-test", ["anything"]) == "qwen3-test"  # a named target wins
    assert resolve_target("auto", ["meta-llama/Llama-3.3-70B-Instruct", ""]) == "llama3"
    with pytest.raises(TargetError, match=r"^target \"auto\": the tokenizer of model 'openai/gpt-4o' is not available "
                       r"offline; set EAGLE_DATA_TARGET_TOKENIZER to a local folder") as e:
        resolve_target("auto", ["openai/gpt-4o"])
    assert "\n" not in str(e.value)
    with pytest.raises(TargetError, match="map to different targets"):
        resolve_target("auto", ["qwen/qwen3-8b", "meta-llama/llama-3.1-8b-instruct"])
    with pytest.raises(TargetError, match="needs the served model id"):
        resolve_target("auto", [""])


def test_reasoning_markers_come_from_the_format_and_only_where_it_has_them() -> None:
    qwen, kimi = reasoning_markers("qwen3"), reasoning_markers("kimi-k2.5")
    assert qwen is not None and (qwen.open_text, qwen.open_id, qwen.close_text, qwen.close_id) == (
        "<think>",
        151667,
        "</think>",
        151668,
    )
    assert kimi is not None and (kimi.open_id, kimi.close_id) == (163606, 163607)
    assert reasoning_markers("llama3") is None and reasoning_markers("mistral") is None


def test_a_format_with_markers_still_needs_a_closing_token(profiles: dict[str, Profile]) -> None:
    fmt = profiles["llama3"].format.model_copy(update={"think_open": "<think>", "think_close": "</think>"})
    with pytest.raises(TargetError, match="think_close must hold a structural token"):
        build_target(profiles["llama3"].model_copy(update={"format": fmt}))


def test_llama_preamble_needs_the_profiles_date(profiles: dict[str, Profile]) -> None:
    with pytest.raises(TargetError, match=r"needs `date` in \[profiles.llama3\]"):
        build_target(profiles["llama3"].model_copy(update={"date": None}))


def test_validation_with_target_auto_uses_the_served_models_profile() -> None:
    import polars as pl

    from eagle_data.catalog import load_catalog
    from eagle_data_tests.fixtures_quality import generation_frame

    spec = load_catalog(profile="demo")["b7_sharegpt"]
    off = spec.generation.model_copy(update={"thinking": False})
    spec = spec.model_copy(update={"target": "auto", "generation": off})
    served = generation_frame(n=4, empty_share=0.0).with_columns(
        served_model=pl.lit("meta-llama/Llama-3.1-8B-Instruct")
    )
    rows = validated_rows(spec, served, "00000")
    assert [ids[:2] for ids in rows["input_ids"].to_list()] == [[128000, 128006]] * 4  # Llama 3's BOS, header
    unknown = served.with_columns(served_model=pl.lit(""), model=pl.lit("openai/gpt-4o"))
    with pytest.raises(TargetError, match=r"^target \"auto\": the tokenizer of model 'openai/gpt-4o' is not available"):
        validated_rows(spec, unknown, "00000")
