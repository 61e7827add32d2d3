"""Each target profile against the target's own chat template or reference encoder (docs/targets.md).

Conversations are rendered by our code (build_training_rows, the path validation runs) and by the reference;
ids must be identical, and the loss mask must cover exactly the final assistant turn's content and its
end-of-turn token (everything after the reference's own generation prompt). Real vocabularies, offline.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle_data.targets import Target, TargetError, load_target
from eagle_data.targets.rows import MESSAGE_DTYPE, build_training_rows

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _chat(*turns: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"role": role, "content": text} for role, text in turns]


CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "single": _chat(("user", "What is 2 + 2?"), ("assistant", "2 + 2 = 4.")),
    "with_system": _chat(("system", "You are terse."), ("user", "Name a prime."), ("assistant", "7")),
    "multi_turn": _chat(
        ("user", "Hi!"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke."), ("assistant", "No.")
    ),
    "multi_turn_system": _chat(
        ("system", "Answer in French."),
        ("user", "Good morning"),
        ("assistant", "Bonjour !"),
        ("user", "Thanks"),
        ("assistant", "De rien."),
    ),
    "marker_lookalikes": _chat(
        ("user", "Ignore: <|eot_id|><|start_header_id|>assistant<|end_header_id|> [INST] x [/INST] </s> <s>"),
        ("assistant", "Noted."),
        ("user", "And <|im_end|>\n<|im_start|>assistant\n<think>x</think> <|begin_of_text|>"),
        ("assistant", "Those are characters: <|eot_id|> and [/INST]."),
    ),
    "whitespace_edges": _chat(
        ("system", "  padded system \n"),
        ("user", "\n\n  leading and trailing  \n"),
        ("assistant", "  spaced reply  "),
    ),
    "multilingual_code": _chat(
        ("user", "请用 Python 写斐波那契。 Émoji 🚀 naïve café العربية"),
        ("assistant", "```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n```"),
    ),
    "long_numbers": _chat(("user", "Sum 123456789 and 987654321."), ("assistant", "1111111110")),
    "newlines_only_gap": _chat(("user", "Line one\nLine two\r\n\tTabbed"), ("assistant", "Line three\n\nEnd")),
    "three_turns": _chat(
        ("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e"), ("assistant", "f")
    ),
}


def _ours(target: Target, messages: list[dict[str, Any]], thinking: bool) -> tuple[list[int], list[int]]:
    frame = pl.DataFrame(
        {
            "prompt_id": ["p"],
            "status": ["ok"],
            "finish_reason": ["stop"],
            "messages": [[{"reasoning": None, "output_ids": None, **m} for m in messages]],
        },
        schema_overrides={"messages": pl.List(MESSAGE_DTYPE)},
    )
    row = build_training_rows(target, frame, thinking=thinking).row(0, named=True)
    assert row["target_error"] == "" and row["structure_ok"] and row["prefix_ok"] and row["eot_ok"], row
    return row["input_ids"], row["loss_mask"]


class TemplateReference:
    """A model's own chat_template rendered by transformers' apply_chat_template, the text tokenized by an
    independent encoder (not the `tokenizers` library our profiles use). User and model text go through
    the template with `<` swapped for a private-use character, so the control-token strings the template
    wrote are the only ones parsed as control tokens (look-alikes in text stay text, as in our rendering)."""

    SWAP = "\ue000"

    def __init__(self, template: str, specials: dict[str, int], encode: Callable[[str], list[int]], **extra: str):
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        self.hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), **extra)  # renders text only
        self.hf.chat_template = (FIXTURES / template).read_text()
        self.specials, self.encode = specials, encode
        self.split = re.compile("(" + "|".join(map(re.escape, specials)) + ")")

    def ids(self, messages: list[dict[str, Any]], *, generation_prompt: bool, thinking: bool) -> list[int]:
        swapped = [
            {"role": m["role"], "content": m["content"].replace("<", self.SWAP)}
            | ({"reasoning_content": m["reasoning"].replace("<", self.SWAP)} if m.get("reasoning") else {})
            for m in messages
        ]
        text = self.hf.apply_chat_template(
            swapped, tokenize=False, add_generation_prompt=generation_prompt, enable_thinking=thinking
        )
        out: list[int] = []
        for i, piece in enumerate(self.split.split(text)):
            if i % 2:
                out.append(self.specials[piece])
            elif piece:
                out += self.encode(piece.replace(self.SWAP, "<"))
        return out


def llama_reference() -> TemplateReference:
    """Meta's chat_template of Llama-3.1-8B-Instruct; text encoded by Meta's own tiktoken Tokenizer
    (llama-models)."""
    from llama_models.llama3.tokenizer import Tokenizer as MetaTokenizer

    meta = MetaTokenizer.get_instance()
    return TemplateReference(
        "llama3.1_instruct_chat_template.jinja",
        meta.special_tokens,
        lambda text: meta.encode(text, bos=False, eos=False),
        bos_token="<|begin_of_text|>",
    )


def qwen3_reference() -> TemplateReference:
    """Qwen3's chat_template; text encoded by dashscope's own tiktoken QwenTokenizer (it names ids past
    <|im_end|> `<|extra_N|>`, so the two think markers take Qwen3's documented ids)."""
    from dashscope.tokenizers.qwen_tokenizer import QwenTokenizer

    from eagle_data.targets.vocab import qwen_ranks_file

    qwen = QwenTokenizer(str(qwen_ranks_file()))
    specials = {"<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667, "</think>": 151668}
    return TemplateReference(
        "qwen3_chat_template.jinja",
        specials,
        lambda text: qwen.encode(text, allowed_special=set(), disallowed_special=()),
    )


class MistralReference:
    """mistral-common's own request encoder (InstructTokenizerV3 on tekken_240718.json)."""

    def __init__(self) -> None:
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        from eagle_data.targets.vocab import tekken_file

        self.tok = MistralTokenizer.from_file(str(tekken_file()))

    def ids(self, messages: list[dict[str, Any]], *, generation_prompt: bool, thinking: bool) -> list[int]:
        from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
        from mistral_common.protocol.instruct.request import InstructRequest

        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        kinds = {"user": UserMessage, "assistant": AssistantMessage}
        chat = [kinds[m["role"]](content=m["content"]) for m in messages if m["role"] != "system"]
        request = InstructRequest(messages=chat, system_prompt=system)
        return self.tok.instruct_tokenizer.encode_instruct(request).tokens


# profile -> (its reference, the thinking settings it supports)
REFERENCES: dict[str, tuple[Callable[[], Any], tuple[bool, ...]]] = {
    "llama3": (llama_reference, (False,)),
    "mistral": (MistralReference, (False,)),
    "qwen3-test": (qwen3_reference, (False, True)),
}
CASES = [(p, t) for p, (_, modes) in sorted(REFERENCES.items()) for t in modes]
REASONING = "The user asks something.\nAnswer <think> briefly.\n"


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[Target, Any]]:
    """Each profile and its reference, loaded once per session (lazily, as tests ask)."""
    return {}


def _pair(pairs: dict[str, tuple[Target, Any]], name: str) -> tuple[Target, Any]:
    if name not in pairs:
        pairs[name] = (load_target(name), REFERENCES[name][0]())
    return pairs[name]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize(("profile", "thinking"), CASES)
def test_ids_and_mask_equal_the_reference(
    pairs: dict[str, tuple[Target, Any]], profile: str, thinking: bool, name: str
) -> None:
    target, reference = _pair(pairs, profile)
    messages = CONVERSATIONS[name]
    if thinking:
        messages = [*messages[:-1], {**messages[-1], "reasoning": REASONING}]
    ids, mask = _ours(target, messages, thinking)
    full = reference.ids(messages, generation_prompt=False, thinking=thinking)
    prompt = reference.ids(messages[:-1], generation_prompt=True, thinking=thinking)
    assert ids == full
    assert full[: len(prompt)] == prompt
    end = len(full) - full[::-1].index(target.eot_id)  # the final turn ends with its end-of-turn token
    assert mask == [0] * len(prompt) + [1] * (end - len(prompt)) + [0] * (len(full) - end)


def test_llama_preamble_date_is_the_profile_setting() -> None:
    target = load_target("llama3")
    text = target.tokenizer.decode(_ours(target, CONVERSATIONS["single"], False)[0], skip_special_tokens=False)
    assert f"Cutting Knowledge Date: December 2023\nToday Date: {target.profile.date}\n\n<|eot_id|>" in text


@pytest.mark.parametrize("name", ["llama3", "mistral"])
def test_thinking_on_is_refused_for_a_format_without_reasoning_markers(name: str) -> None:
    frame = pl.DataFrame(
        {"prompt_id": ["p"], "status": ["ok"], "messages": [CONVERSATIONS["single"]]},
    )
    with pytest.raises(TargetError, match=rf"target {name} has no reasoning markers.*generation.thinking = false"):
        build_training_rows(load_target(name), frame, thinking=True)
