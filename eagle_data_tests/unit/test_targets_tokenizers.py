"""The text encoder (it shares the tokenizer's model and re-adds its tokens as special) against the full serialized
copy it replaced: the same down to its JSON, and the same ids on text that types every added token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from eagle_data.targets.tokenizer import text_encoder
from eagle_data.targets.vocab import qwen_tokenizer

TEXTS = [
    "Hello, world! Ünïcödé, 中文, emoji 🙂 and   spaces\n\n\ttabs.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nreasoning\n</think>\n\nanswer<|im_end|>",
    "<think></think><|endoftext|> <|im_end|>x<|im_start|><tool_call>{}</tool_call>",
]


def _reference(tokenizer: Tokenizer) -> Tokenizer:
    """The copy `text_encoder` made before: through the JSON, every added token flagged special."""
    spec = json.loads(tokenizer.to_str())
    for token in spec["added_tokens"]:
        token["special"] = True
    encoder = Tokenizer.from_str(json.dumps(spec))
    encoder.encode_special_tokens = True
    return encoder


def _qwen3_as_shipped() -> Tokenizer:
    """Qwen3's vocabulary with `<think>`/`</think>` unflagged, as its tokenizer.json ships them."""
    spec = json.loads(qwen_tokenizer().to_str())
    for token in spec["added_tokens"]:
        token["special"] = token["content"] not in ("<think>", "</think>")
    return Tokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("source", ["qwen3", "smollm2"])
def test_text_encoder_matches_the_serialized_copy(source: str, request: pytest.FixtureRequest) -> None:
    if source == "qwen3":
        tokenizer = _qwen3_as_shipped()
    else:
        tokenizer = Tokenizer.from_file(str(Path(request.getfixturevalue("smollm2")) / "tokenizer.json"))
    shipped = tokenizer.to_str()
    encoder, reference = text_encoder(tokenizer), _reference(tokenizer)
    assert tokenizer.to_str() == shipped  # the original (a shared builtin, say) is left as it was
    assert json.loads(encoder.to_str()) == json.loads(reference.to_str())
    typed = " ".join(t.content for t in tokenizer.get_added_tokens_decoder().values())
    texts = [*TEXTS, typed]
    ids = [e.ids for e in encoder.encode_batch(texts, add_special_tokens=False)]
    assert ids == [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    assert not set(tokenizer.get_added_tokens_decoder()) & {i for row in ids for i in row}  # typed stays text
    assert encoder.decode_batch(ids, skip_special_tokens=False) == texts


def test_padding_truncation_and_an_unflagged_token_are_kept() -> None:
    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken("<a>", special=True)])
    tokenizer.add_tokens([AddedToken("<b>", normalized=False)])
    tokenizer.enable_padding(length=8, pad_id=2, pad_token="[UNK]")
    tokenizer.enable_truncation(max_length=8)
    encoder, reference = text_encoder(tokenizer), _reference(tokenizer)
    assert json.loads(encoder.to_str()) == json.loads(reference.to_str())
    assert encoder.encode("a <b> b <a>").ids == reference.encode("a <b> b <a>").ids == [0, 2, 1, 2, 1, 2, 0, 2]
    assert tokenizer.encode("a <b> b <a>").ids == [0, 4, 1, 3, 2, 2, 2, 2]  # the original still parses them
