"""What made each row: the columns that say which settings, server and tokenizer produced it.

Generation rows carry `sampling` (the engine's request settings as sent: model, temperature, top_p,
max tokens, reasoning and routing, as sorted JSON; the same settings hash to `config_hash`, the resume
key), `served_model` (the model id the server reports serving; "" where it reports none, e.g. SGLang's
/generate), beside the existing `engine`, `model` and `provider` (the serving provider OpenRouter
reports). Validation adds `target` (the target the ids were made for: a profile's name, or `checkpoint:<ref>` for
one derived from the model's own checkpoint), `tokenizer_hash` and `chat_template_hash` (its tokenizer and chat
template, which made the ids). The exports carry all of them, so a trainer can filter rows by how
they were made. A model revision or quantization is not reported by any engine's responses today.
"""

from __future__ import annotations

import json
from typing import Any

GENERATION = ("engine", "model", "served_model", "provider", "sampling", "config_hash")
TARGET = ("target", "tokenizer_hash", "chat_template_hash")
COLUMNS = (*GENERATION, *TARGET)


def sampling(config: dict[str, Any]) -> str:
    """The engine's output-changing settings (Engine.config: never secrets) as sorted JSON."""
    return json.dumps(config, sort_keys=True, default=str)
