"""Target-model profiles: tokenizers, chat formats, token ids and loss masks."""

from eagle_data.targets.profile import CHECKPOINT, TargetError, resolve_target, target_for_model
from eagle_data.targets.reasoning import ReasoningMarkers, reasoning_markers
from eagle_data.targets.render import prompt_difference, prompt_ids, prompt_ids_match
from eagle_data.targets.rows import build_training_rows
from eagle_data.targets.target import Target, load_target

__all__ = [
    "CHECKPOINT",
    "ReasoningMarkers",
    "Target",
    "TargetError",
    "build_training_rows",
    "load_target",
    "prompt_difference",
    "prompt_ids",
    "prompt_ids_match",
    "reasoning_markers",
    "resolve_target",
    "target_for_model",
]
