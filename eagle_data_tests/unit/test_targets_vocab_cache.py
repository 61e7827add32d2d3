"""The disk cache of built-in tokenizers: a later process loads the same ids; a bad or stale file is never used.

Every test points the cache at a tmp folder (EAGLE_DATA_CACHE), never at the user's own. The mechanism is
tested on a small real WordLevel tokenizer; one test goes through the real Qwen conversion across processes.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from eagle_data import settings
from eagle_data.demo import DEMO_MODEL_ENV, demo_model_path
from eagle_data.targets import vocab, vocab_cache
from eagle_data.targets.vocab_cache import Layout, cached_tokenizer

TEXTS = [
    "<|im_start|>user\nHello, wörld! 12345 <think>\nhmm</think>\n\n<|im_end|>\n",
    '<tool_call>{"name": "f"}</tool_call><|endoftext|>  tabs\t\tand  spaces\r\n',
    "日本語のテキスト 🙂 <|vision_pad|><|fim_middle|>",
]
PROBE = """
import json, sys
from eagle_data.targets.vocab import QWEN_SPECIALS, qwen_tokenizer
tok = qwen_tokenizer()
texts = json.loads(sys.argv[1])
print(json.dumps({"ids": [e.ids for e in tok.encode_batch(texts)], "size": tok.get_vocab_size(),
                  "specials": {s: tok.token_to_id(s) for s in QWEN_SPECIALS}}))
"""
SPECIALS = {"<s>": 3, "</s>": 4}


@pytest.fixture
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(settings.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizers"


def encodings(tok: Tokenizer) -> dict:
    return {"ids": [e.ids for e in tok.encode_batch(TEXTS)], "size": tok.get_vocab_size(),
            "specials": {s: tok.token_to_id(s) for s in vocab.QWEN_SPECIALS}}  # fmt: skip


def test_a_second_process_loads_the_cached_qwen_tokenizer_with_the_ids_of_a_fresh_build(cache_folder: Path):
    fresh = vocab.qwen_tokenizer.__wrapped__()  # no file yet: converted from the ranks, then stored
    [stored] = cache_folder.iterdir()  # the one file, no staging file left behind
    assert stored.name.startswith("qwen-") and stored.suffix == ".json"
    before = stored.stat()
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(TEXTS)], capture_output=True, text=True,
                         env=settings.environment(), check=True, timeout=120)  # fmt: skip
    assert json.loads(out.stdout) == encodings(fresh)
    assert fresh.token_to_id("<|im_end|>") == 151645 and fresh.get_vocab_size() == 151669
    after = stored.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "rebuilt instead of loaded"


def word_tokenizer(specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    return tok


class Builder:
    """A build function that counts its calls."""

    def __init__(self, specials: list[str]) -> None:
        self.specials, self.calls = specials, 0

    def __call__(self) -> Tokenizer:
        self.calls += 1
        return word_tokenizer(self.specials)


def cached(build: Builder, *, recipe: bytes = b"recipe", inputs: tuple = (b"ranks", "pattern"),
           specials: dict[str, int] = SPECIALS) -> Tokenizer:  # fmt: skip
    return cached_tokenizer("words", recipe=recipe, inputs=inputs, layout=Layout(5, specials), build=build)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda text: text[: len(text) // 2], id="truncated"),
        pytest.param(lambda text: "", id="empty"),
        pytest.param(lambda text: word_tokenizer(["</s>", "<s>"]).to_str(), id="special ids swapped"),
        pytest.param(lambda text: word_tokenizer(["<s>"]).to_str(), id="a special missing"),
    ],
)
def test_a_damaged_cache_file_is_rebuilt_and_replaced(cache_folder: Path, damage, caplog) -> None:
    build = Builder(list(SPECIALS))
    cached(build)
    [stored] = cache_folder.iterdir()
    stored.write_text(damage(stored.read_text()))
    with caplog.at_level(logging.WARNING):
        tok = cached(build)
    assert build.calls == 2, "a damaged file was used"
    assert "rebuilding" in caplog.text
    assert {s: tok.token_to_id(s) for s in SPECIALS} == SPECIALS
    assert Tokenizer.from_file(str(stored)).to_str() == tok.to_str(), "the damaged file was not replaced"
    cached(build)
    assert build.calls == 2, "the replaced file is not loaded"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"inputs": (b"other ranks", "pattern")}, id="ranks"),
        pytest.param({"inputs": (b"ranks", "other pattern")}, id="pattern"),
        pytest.param({"recipe": b"edited recipe"}, id="recipe"),
        pytest.param({"specials": {"<s>": 3, "<pad>": 4}}, id="specials"),
        pytest.param({"specials": {"<s>": 4, "</s>": 3}}, id="special ids"),
        pytest.param({"FORMAT_VERSION": "0"}, id="format version"),
        pytest.param({"version": lambda lib: "0.0.0"}, id="library versions"),
    ],
)
def test_a_changed_key_input_builds_anew_and_leaves_the_old_file(cache_folder: Path, change: dict, monkeypatch):
    cached(Builder(list(SPECIALS)))
    [old] = cache_folder.iterdir()
    old_text = old.read_text()
    patched = {"FORMAT_VERSION", "version"} & set(change)
    for name in patched:
        monkeypatch.setattr(vocab_cache, name, change[name])
    specials = change.get("specials", SPECIALS)
    build = Builder(sorted(specials, key=specials.get))
    tok = cached(build, **{k: v for k, v in change.items() if k not in patched})
    assert build.calls == 1, "the old file was reused"
    assert {s: tok.token_to_id(s) for s in specials} == specials
    assert len(list(cache_folder.iterdir())) == 2 and old.read_text() == old_text


def test_an_unwritable_cache_folder_builds_in_memory(tmp_path: Path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(settings.CACHE_ENV, str(blocker))  # the cache folder would have to be inside a file
    build = Builder(list(SPECIALS))
    with caplog.at_level(logging.WARNING):
        tok = cached(build)
    assert {s: tok.token_to_id(s) for s in SPECIALS} == SPECIALS
    assert "built in memory only" in caplog.text


def test_a_fresh_build_without_its_layout_fails_and_is_not_stored(cache_folder: Path):
    with pytest.raises(ValueError, match=r"built-in tokenizer words: id 3 is '</s>', expected special '<s>'"):
        cached(Builder(["</s>", "<s>"]))
    assert not cache_folder.exists() or not list(cache_folder.iterdir())


def test_the_demo_model_lives_in_the_same_cache_folder(cache_folder: Path, monkeypatch):
    monkeypatch.delenv(DEMO_MODEL_ENV, raising=False)
    assert demo_model_path().parent == cache_folder.parent
