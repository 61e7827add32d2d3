"""Where a target's reasoning block starts and ends: the one accessor every engine's reasoning split reads."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from eagle_data.targets.profile import CHECKPOINT, TargetError, read_profiles


@dataclass(frozen=True)
class ReasoningMarkers:
    """The structural tokens around a think block, as text and (where the profile gives them) ids, and the
    text the chat format strips from each side (so a split reply renders back to the same tokens).

    Attributes:
        open_text / close_text: the tokens opening and closing the block (e.g. `<think>`, `</think>`).
        open_id / close_id: their ids in the target's vocabulary; None when unknown (no profile).
        strip_reasoning: characters stripped from both ends of the reasoning.
        strip_content: characters stripped from the start of the content.
    """

    open_text: str
    close_text: str
    open_id: int | None = None
    close_id: int | None = None
    strip_reasoning: str = "\n"
    strip_content: str = "\n"


THINK_TAGS = ReasoningMarkers("<think>", "</think>")  # DeepSeek-R1's, Qwen3's and Kimi's; used where no target is given


@cache
def reasoning_markers(target: str) -> ReasoningMarkers | None:
    """The think-block markers of target `target` (a profile: read from targets.toml, no tokenizer loaded; a
    checkpoint's: its tokenizer's `<think>`/`</think>` where its template writes them), or None when it has none."""
    if target.startswith(CHECKPOINT):
        from eagle_data.targets.target import load_target

        loaded = load_target(target)
        if not loaded.think_ids:
            return None
        ids = [loaded.tokenizer.token_to_id(t) for t in (THINK_TAGS.open_text, THINK_TAGS.close_text)]
        return ReasoningMarkers(THINK_TAGS.open_text, THINK_TAGS.close_text, ids[0], ids[1])
    profiles = read_profiles()
    if target not in profiles:
        raise TargetError(f"unknown target {target!r}; known: {', '.join(sorted(profiles))}")
    profile = profiles[target]
    fmt = profile.format

    def token_in(text: str) -> str | None:
        return max((token for token in profile.tokens if token in text), key=len, default=None)

    opening, closing = token_in(fmt.think_open), token_in(fmt.think_close)
    if opening is None or closing is None:
        return None
    return ReasoningMarkers(
        open_text=opening,
        close_text=closing,
        open_id=profile.tokens[opening],
        close_id=profile.tokens[closing],
        strip_reasoning=fmt.strip_reasoning,
        strip_content=fmt.strip_content_start,
    )
