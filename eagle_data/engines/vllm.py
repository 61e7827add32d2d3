"""vLLM's OpenAI-compatible server, asked for token ids: the OpenAI-compatible client with `return_token_ids`.

Each answer then carries the reply's own token ids (`choices[].token_ids`, kept as `output_ids`) and the
prompt ids the server rendered (`prompt_token_ids`, kept as `prompt_ids`), so training ids need no
re-tokenization and the server's chat template can be checked against the target profile's. A server
that ignores the field (an older vLLM, or not vLLM) is refused on its first answer.
"""

from __future__ import annotations

from typing import Any

from eagle_data.engines import EngineKind, register
from eagle_data.engines.openai_compat import HTTP_SETTINGS, MODEL_FIX, OpenAICompatEngine, build_compatible, make_openai

VLLM = "vllm"


def make_vllm(**arguments: Any) -> OpenAICompatEngine:
    """A vLLM server at `base_url` (its /v1), asked for token ids; no API key unless `api_key_env` names one."""
    return make_openai(name=VLLM, token_ids=True, **arguments)


register(EngineKind(
    name=VLLM, build=build_compatible, make=make_vllm, takes=HTTP_SETTINGS,
    summary="a vLLM server's OpenAI API at EAGLE_DATA_BASE_URL, with token ids",
    required={"model": MODEL_FIX, "base_url": "set EAGLE_DATA_BASE_URL (e.g. http://host:8000/v1)"},
))  # fmt: skip
