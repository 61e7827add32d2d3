import asyncio
from pathlib import Path

import pytest

from eagle_data.catalog import Generation
from eagle_data.engines import make_engine
from eagle_data.engines.local import LocalEngine, _fingerprint, _to_completion
from eagle_data.runner.resultlog import resume_key
from eagle_data.standins.openai_fake import spec_for_tests
from eagle_data.types import FatalError

GEN = Generation(max_tokens=40, min_tokens=8, temperature=0.8, top_p=0.95, thinking=False)
CHAT = [{"role": "user", "content": "Write a haiku about compilers."}]


@pytest.fixture(scope="module")
def engine(demo_model: Path) -> LocalEngine:
    return LocalEngine(demo_model, GEN, demo=True)


def test_local_engine_returns_its_own_tokens(engine: LocalEngine):
    tokenizer, _ = engine._load()
    done = asyncio.run(engine.complete(CHAT, prompt_id="p1"))
    assert done.output_ids and 8 <= done.completion_tokens == len(done.output_ids) <= 40
    stopped = done.output_ids[-1] == tokenizer.eos_token_id
    assert done.finish_reason == ("stop" if stopped else "length")
    body = done.output_ids[:-1] if stopped else done.output_ids
    assert done.content == tokenizer.decode(body).lstrip("\n")
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=False, return_dict=True)
    assert done.prompt_tokens == len(prompt["input_ids"])


def test_local_engine_is_reproducible_per_prompt(engine: LocalEngine):
    a = asyncio.run(engine.complete(CHAT, prompt_id="same"))
    b = asyncio.run(engine.complete(CHAT, prompt_id="same"))
    c = asyncio.run(engine.complete(CHAT, prompt_id="other"))
    assert a.output_ids == b.output_ids != c.output_ids


def test_engines_share_a_loaded_checkpoint_until_it_is_rewritten(engine: LocalEngine, tmp_path: Path):
    """Each run builds its own engine: the next run in this process must not load the model again."""
    assert LocalEngine(engine.model_path, GEN)._load() is engine._load()
    (tmp_path / "config.json").write_text("{}")
    before = _fingerprint(tmp_path)
    (tmp_path / "config.json").write_text('{"rewritten": true}')
    assert _fingerprint(tmp_path) != before


def test_reasoning_is_split_at_the_think_end_token(engine: LocalEngine):
    tokenizer, _ = engine._load()
    ids = tokenizer.encode("<think>\nstep one\n</think>\n\nThe answer.<|im_end|>", add_special_tokens=False)
    done = _to_completion(tokenizer, ids, prompt_ids=[0] * 5)
    assert (done.reasoning, done.content, done.finish_reason) == ("step one", "The answer.", "stop")
    cut = _to_completion(tokenizer, ids[:-1], prompt_ids=[0] * 5)
    assert cut.finish_reason == "length" and cut.truncated


def test_two_checkpoints_with_the_same_folder_name_never_share_a_resume_key(tmp_path: Path):
    for run in ("a", "b"):
        (tmp_path / run / "final").mkdir(parents=True)
        (tmp_path / run / "final" / "config.json").write_text("{}")  # only the folder's presence is checked here
    a, b = (make_engine("local", model=str(tmp_path / run / "final"), **GEN.model_dump()) for run in ("a", "b"))
    spec = spec_for_tests()
    assert resume_key(a.config(), spec).config_hash != resume_key(b.config(), spec).config_hash
    assert a.config()["model"] == str((tmp_path / "a" / "final").resolve()) and a.config()["max_tokens"] == 40
    assert (a.model, b.model) == (a.config()["model"], b.config()["model"])  # rows name the checkpoint itself


def test_missing_checkpoint_is_a_one_line_error(tmp_path: Path):
    with pytest.raises(FatalError) as err:
        make_engine("local", model=str(tmp_path / "nothing"), **GEN.model_dump())
    assert "nothing" in str(err.value) and "eagle-data demo-model" in str(err.value)


def test_the_demo_model_says_so_in_what_it_reports(demo_model: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model))
    demo = make_engine("local", model=str(demo_model), **GEN.model_dump())
    assert demo.describe() == "local (the demo model)"
    assert "the demo model" in (line := asyncio.run(demo.check())) and str(demo_model.resolve()) in line
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model.parent / "elsewhere"))
    assert make_engine("local", model=str(demo_model), **GEN.model_dump()).describe() == f"local {demo_model.resolve()}"
