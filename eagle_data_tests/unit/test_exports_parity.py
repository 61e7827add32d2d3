"""The export's trainer files through SpecForge 0.2.0's own released code (installed `--no-deps`, its data
modules only): the pre-tokenized `prompts.jsonl` loads as our ids and masks on every row through the loader
behind `data.prompts_path`; the text files, tokenized again by its template path, differ only by named causes;
the blocking `trainer_parity` check fails when a trainer would train on other data.

Rows are built by the real validation code (`build_training_rows`) on the demo target with the demo model's
tokenizer and chat template (`eagle_data.standins.random_model`), as `training_mix` writes them on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest

from eagle_data import layout
from eagle_data.catalog import Adapter, Checks, DatasetSpec, Generation
from eagle_data.exports import Admission
from eagle_data.exports.check import check_exports
from eagle_data.exports.formats import FORMATS, chosen
from eagle_data.exports.parity import ParityError
from eagle_data.exports.settings import ExportSettings
from eagle_data.stages.export import export
from eagle_data.standins.random_model import CHAT_TEMPLATE
from eagle_data.storage import ShardStore, digests
from eagle_data.targets import build_training_rows, load_target
from eagle_data.targets.rows import MESSAGE_DTYPE

ALL = tuple(FORMATS)


def turn(role: str, content: str, reasoning: str | None = None) -> dict[str, object]:
    return {"role": role, "content": content, "reasoning": reasoning, "output_ids": None}


# one-turn, multi-turn, with a system turn, unicode, code, a reply in the model's own tokens
CONVERSATIONS = [
    [turn("user", "2+2?"), turn("assistant", "It is 4.", "Add two and two.\nThat is 4.")],
    [turn("system", "Réponds en français."), turn("user", "Bonjour « ça va » ?"),
     turn("assistant", "Salut ! 你好, ça va bien.", "Greet back.")],
    [turn("user", "Write code."), turn("assistant", "def f():\n    return 1\n", "Easy."),
     turn("user", "Now in C?"), turn("assistant", "int f(void) { return 1; }", "Translate it.")],
    [turn("user", "Quote:"), turn("assistant", "« To be, or not to be » — Hamlet.", "A quote.\n\nFamous.")],
    [turn("user", "Spell it."), turn("assistant", "Hello river", "Letters.")],  # the model's own split
]  # fmt: skip
RETOKENIZED = 4  # its reply ids as a model may generate them: "Hello" in single letters, not the BPE split


def model_split(ids: list[int], thinking: bool) -> list[int]:
    """The final reply's ids as the engine returns them (after the generation prompt, before the end-of-turn)
    with one word spelled in single-letter tokens: the same text in other tokens."""
    target = load_target("demo")
    # after <|im_start|> assistant \n, and with thinking off the prompt's empty <think> \n\n </think> \n\n
    start = len(ids) - 1 - ids[::-1].index(151644) + 3 + (0 if thinking else 4)
    body = ids[start : len(ids) - 2]  # before <|im_end|> \n
    word = next(i for i, t in enumerate(body) if target.tokenizer.decode([t]) == "Hello")
    letters = [t for ch in "Hello" for t in target.text_encoder.encode(ch).ids]
    return [*body[:word], *letters, *body[word + 1 :]]


def validated(name: str, thinking: bool) -> pl.DataFrame:
    """A validated shard of `name` as the validation stage writes it, every row passing."""
    convs = [[{**m, "reasoning": m["reasoning"] if m["role"] != "assistant" or thinking else ""} for m in c]
             for c in CONVERSATIONS]  # fmt: skip
    gens = pl.DataFrame({
        "prompt_id": [f"{name}-{i}" for i in range(len(convs))], "dataset": name, "status": "ok",
        "finish_reason": "stop", "content": [c[-1]["content"] for c in convs],
        "reasoning": [c[-1]["reasoning"] for c in convs], "completion_tokens": [1] * len(convs),
        "model": "demo", "messages": pl.Series(convs, dtype=pl.List(MESSAGE_DTYPE)),
    })  # fmt: skip
    rows = build_training_rows(load_target("demo"), gens, thinking=thinking)
    convs[RETOKENIZED][-1]["output_ids"] = model_split(rows["input_ids"][RETOKENIZED].to_list(), thinking)
    rows = build_training_rows(load_target("demo"), gens.with_columns(
        messages=pl.Series(convs, dtype=pl.List(MESSAGE_DTYPE))), thinking=thinking)  # fmt: skip
    assert rows["ids_match"].to_list()[RETOKENIZED] is False
    return rows.with_columns(verdict=pl.lit("pass"))


def spec(name: str, thinking: bool) -> DatasetSpec:
    return DatasetSpec(name=name, title=name, adapter=Adapter(prompt_field="q"), max_prompts=10, shard_size=10,
                       target="demo", generation=Generation(thinking=thinking),
                       checks=Checks(min_loss_tokens=0))  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model's tokenizer as its checkpoint ships it (demo.build_demo_model): SpecForge's AutoTokenizer."""
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("demo-tokenizer")
    vocab = load_target("demo").tokenizer  # the Qwen vocabulary the demo model ships (targets.vocab.qwen_tokenizer)
    shipped = PreTrainedTokenizerFast(tokenizer_object=vocab, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)
    shipped.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[ShardStore, list[DatasetSpec]]:
    """Every format exported: one dataset with thinking on, one with thinking off (the demo's setting)."""
    store = ShardStore(str(tmp_path_factory.mktemp("export")))
    specs = [spec("b91_think", True), spec("b92_plain", False)]
    for s in specs:
        store.write_shard(s.name, layout.validated_asset(s.name), "00000", validated(s.name, s.generation.thinking))
    export(specs, store, {s.name: Admission(("00000",)) for s in specs}, seed=0, formats=ALL)
    return store, specs


def test_specforge_loads_the_mix_prompts_file_as_our_ids_and_masks_on_every_row(exported) -> None:
    """SpecForge's own `data.prompts_path` loader, called as its trainer calls it, on the whole file."""
    from specforge.data.prompt_builder import prepare_prompt_tasks

    store, _ = exported
    path = Path(store.root, layout.mix_file("prompts.jsonl"))
    ours = pl.read_parquet(Path(store.root, layout.mix()))
    loaded = prepare_prompt_tasks(path, None, chat_template=None, max_length=2048, is_preformatted=False,
                                  train_only_last_turn=False, cache_dir=None, cache_key=None,
                                  num_proc=None)  # fmt: skip
    assert len(loaded) == ours.height == 2 * len(CONVERSATIONS)
    assert [t["payload"]["input_ids"] for t in loaded] == ours["input_ids"].to_list()
    assert [t["payload"]["loss_mask"] for t in loaded] == ours["loss_mask"].to_list()
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ours["prompt_id"].to_list()


def test_parity_report_counts_every_difference_of_the_text_exports_by_cause(exported, tokenizer_folder) -> None:
    store, specs = exported
    config = ExportSettings(formats=ALL, parity_rows=0, trainer_tokenizer=str(tokenizer_folder))
    report = check_exports(store, specs, config)
    got = {f"{where}/{p.file}": (p.checked, p.identical, dict(p.causes)) for where, _, p in report.files}
    n, no_system = len(CONVERSATIONS), len(CONVERSATIONS) - 1
    text = {"default_system_message": no_system, "retokenized": 1, "template_tokens": n - 1}
    expected = {
        "b91_think/prompts.jsonl": (n, n, {}),
        # qwen3-thinking: a system message inserted where the row has none; the "\n" after <|im_end|> supervised;
        # the row in the model's own tokens tokenized again (its mask is not compared)
        "b91_think/conversations.jsonl": (n, 0, text),
        "b91_think/sharegpt.jsonl": (n, 0, {"default_system_message": no_system, "reasoning_not_carried": n}),
        "b92_plain/prompts.jsonl": (n, n, {}),
        # qwen3-instruct (thinking off) leaves the empty think block out of the loss, as we do
        "b92_plain/conversations.jsonl": (n, 0, text),
        "b92_plain/sharegpt.jsonl": (n, 0, text),
        "mix/prompts.jsonl": (2 * n, 2 * n, {}),
    }  # fmt: skip
    assert {k: got[k] for k in expected} == expected  # a format added later is held by the line below
    assert not report.failures  # named causes only: the text exports report, the tokenized ones are identical
    conv = next(p for where, _, p in report.files if where == "b91_think" and p.file == "conversations.jsonl")
    assert conv.tokens["template_tokens"] == 5  # a "\n" after <|im_end|> per assistant turn (1 + 1 + 2 + 1)


def test_thinking_template_on_thinking_off_rows_names_the_supervised_think_markers(exported, tokenizer_folder):
    store, specs = exported
    config = ExportSettings(formats=("specforge_text",), parity_rows=0, trainer_tokenizer=str(tokenizer_folder),
                            specforge_template="qwen3-thinking")  # fmt: skip
    (_, _, plain), = [f for f in check_exports(store, specs[1:], config).files]  # fmt: skip
    assert plain.causes["think_markers"] == len(CONVERSATIONS) - 1  # the retokenized row's mask is not compared
    assert plain.tokens["think_markers"] == 4 * (len(CONVERSATIONS) - 1)  # <think> "\n\n" </think> "\n\n"


def test_parity_check_fails_on_a_prompts_file_that_differs_from_the_verified_rows(exported, tmp_path: Path) -> None:
    """One mask value flipped in one row of the mix's prompts.jsonl, as the export wrote it (its recorded digest is
    of these bytes): the check names the file and the row count."""
    store, specs = exported
    copy = ShardStore(str(tmp_path))
    for key in store.list(""):
        copy.write_bytes(key, store.read_bytes(key))
    path = Path(copy.root, layout.mix_file("prompts.jsonl"))
    lines = path.read_text().splitlines()
    row = json.loads(lines[2])
    row["loss_mask"][-1] = 1 - row["loss_mask"][-1]
    path.write_text("\n".join([*lines[:2], json.dumps(row), *lines[3:]]) + "\n")
    written = digests.read_record(copy, layout.export_record())
    assert written is not None
    written.files[layout.mix_file("prompts.jsonl")] = digests.FileDigest.of_file(path)
    digests.write_record(copy, layout.export_record(), written.files)
    report = check_exports(copy, specs, ExportSettings(parity_rows=0))
    assert report.failures == ["mix prompts.jsonl: other 1"]
    assert report.summary().startswith("a trainer would train on data other than ours: mix prompts.jsonl")


def test_parity_without_specforge_fails_in_one_line_naming_the_install(exported, monkeypatch) -> None:
    store, specs = exported
    monkeypatch.setitem(sys.modules, "specforge.data.prompt_builder", None)
    with pytest.raises(ParityError, match=r"pip install --no-deps specforge==0\.2\.0") as caught:
        check_exports(store, specs, ExportSettings())
    assert "\n" not in str(caught.value)


def test_unknown_format_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=f"unknown specforge_jsonl; known: {', '.join(FORMATS)}$"):
        chosen(["specforge_jsonl"])


def test_a_bad_exports_setting_is_a_one_line_catalog_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eagle_data.catalog import CatalogError
    from eagle_data.exports.settings import export_settings

    catalog = tmp_path / "catalog.toml"
    catalog.write_text('[exports]\nformats = ["specforge_prompts", "parquet"]\n')
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(catalog))
    said = rf"^\[exports\] formats: unknown parquet; known: .*specforge_prompts.* \(fix {catalog}\)$"
    with pytest.raises(CatalogError, match=said) as caught:
        export_settings()
    assert "\n" not in str(caught.value)
