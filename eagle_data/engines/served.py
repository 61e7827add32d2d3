"""Which model a server serves: one match rule and one error, shared by the SGLang fleet's probe and the
OpenAI-compatible engine's check, so no engine answers real prompts with another model than the one asked for.
"""

from __future__ import annotations

from eagle_data.types import AbortError


class ModelMismatchError(AbortError):
    """The server serves another model than the one configured."""

    kind = "model_mismatch"


def model_matches(served: str, wanted: str) -> bool:
    """True when a served model name (SGLang's `model_path`, an id from /models) names the configured model.

    Servers often load a local copy: `/models/Qwen3-8B` or an HF cache snapshot
    (`…/models--Qwen--Qwen3-8B/snapshots/<sha>`) serve `Qwen/Qwen3-8B`.
    """
    served, wanted = served.rstrip("/"), wanted.rstrip("/")
    if served == wanted or served.endswith("/" + wanted):
        return True
    if "models--" + wanted.replace("/", "--") + "/" in served + "/":
        return True
    return served.rsplit("/", 1)[-1] == wanted.rsplit("/", 1)[-1]
