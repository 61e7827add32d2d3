"""Target-model profiles: tokenizers, chat formats, token ids and loss masks."""

from eagle_data.targets.profile import Target, TargetError, load_target
from eagle_data.targets.reasoning import ReasoningMarkers, reasoning_markers
from eagle_data.targets.render import prompt_ids
from eagle_data.targets.rows import build_training_rows

__all__ = [
    "ReasoningMarkers",
    "Target",
    "TargetError",
    "build_training_rows",
    "load_target",
    "prompt_ids",
    "reasoning_markers",
]
