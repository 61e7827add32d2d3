"""Sampling mixtures: which of the catalog's weighted sampling settings each prompt is generated with.

A prompt's setting is a pure function of its id and the mixture's seed: SHA-256 of "{seed}:{prompt_id}"
read as a number in [0, 1), placed on the settings' cumulative weights. A re-run, a resumed run or
another machine assigns the same setting; adding prompts moves no other prompt's setting.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from itertools import accumulate

from eagle_data.catalog import SamplingSetting

SCALE = float(1 << 64)


def unit(prompt_id: str, seed: int) -> float:
    """A uniform number in [0, 1) from the prompt id and seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()[:8], "big") / SCALE


def assign(prompt_id: str, mixture: tuple[SamplingSetting, ...], seed: int) -> SamplingSetting | None:
    """The prompt's setting (None when the catalog entry has no mixture)."""
    if not mixture:
        return None
    bounds = list(accumulate(s.weight for s in mixture))
    return mixture[min(bisect_right(bounds, unit(prompt_id, seed) * bounds[-1]), len(mixture) - 1)]


def realized(names: Iterable[str], mixture: tuple[SamplingSetting, ...]) -> dict[str, float]:
    """Figures: per setting, the configured share and its share of `names` (the settings rows were made with)."""
    counts = Counter(names)
    total = sum(counts.values()) or 1
    weights = sum(s.weight for s in mixture) or 1.0
    figures: dict[str, float] = {}
    for s in mixture:
        figures[f"mix_{s.name}_configured"] = round(s.weight / weights, 4)
        figures[f"mix_{s.name}_realized"] = round(counts[s.name] / total, 4)
    return figures
