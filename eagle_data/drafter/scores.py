"""The on-policy figures a hidden-state capture takes from its own forward passes (docs/hidden-states.md): which
rows of a shard (`on_policy_rows`, seeded by prompt id), at which sampling settings (each mix row's `sampling`),
and their figures, kept across batches and a resumed run (the progress file) until the shard's record holds them."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from eagle_data.drafter.layers import LayerPlan
from eagle_data.drafter.settings import CaptureSettings
from eagle_data.engines.scoring import Row, TargetIds, figures_for
from eagle_data.quality import on_policy
from eagle_data.quality.canary import rank
from eagle_data.quality.on_policy import SamplingPoint, Scored

GREEDY = SamplingPoint(0.0)  # a mix row without its generation's sampling settings is judged as greedy


@dataclass
class ShardScores:
    """One capture shard's scored rows: position among its kept rows -> the row (its final reply) to score."""

    target: TargetIds
    rows: dict[int, Row]
    figures: dict[str, Any]  # mix row number (as text) -> its figures

    @staticmethod
    def plan(
        kept: pl.DataFrame, ids: Sequence[np.ndarray], masks: Sequence[np.ndarray], settings: CaptureSettings,
        target: TargetIds, progress: MutableMapping[str, Any],
    ) -> ShardScores:  # fmt: skip
        """The `on_policy_rows` kept rows of smallest seeded hash of their prompt id among those with a supervised
        token past the first, and the figures a resumed shard already took; the progress record then carries
        the figures as they are taken."""
        samplings = kept["sampling"].to_list() if "sampling" in kept.columns else [None] * kept.height
        able = [
            (rank(settings.seed, prompt_id), at)
            for at, (prompt_id, mask) in enumerate(zip(kept["prompt_id"], masks, strict=True))
            if mask[1:].any()
        ]
        chosen = sorted(at for _, at in sorted(able)[: settings.on_policy_rows])
        rows = {
            at: Row(ids[at], on_policy.final_reply(masks[at]), on_policy.row_sampling(samplings[at], None, GREEDY))
            for at in chosen
        }
        figures = progress[on_policy.COLUMN] = dict(progress.get(on_policy.COLUMN, {}))
        return ShardScores(target, rows, figures)

    def batch(self, group: Sequence[int]) -> dict[int, Row]:
        """The rows of one batch (its positions among the shard's kept rows) to score, by index in the batch."""
        return {j: self.rows[at] for j, at in enumerate(group) if at in self.rows}

    def add(self, group: Sequence[int], numbers: Sequence[int], scored: Mapping[int, Scored]) -> None:
        """One batch's scored rows (by index in the batch), `numbers` the mix row of each kept row."""
        for j, one in scored.items():
            self.figures[str(numbers[group[j]])] = figures_for(one, self.rows[group[j]], self.target, "capture")

    def record(self) -> dict[str, Any] | None:
        """The shard record's `on_policy`: each scored row's figures and their totals (None when none)."""
        if not self.figures:
            return None
        return {"figures": on_policy.totals(self.figures.values()).numbers(), "rows": self.figures}


def forward(
    backend: Any, batch: list[np.ndarray], plan: LayerPlan, scores: ShardScores | None, group: Sequence[int],
    numbers: Sequence[int],
) -> list[Any]:  # fmt: skip
    """One batch's states (`CaptureBackend.capture`); with `scores`, its scored rows' figures from the same forward
    pass, where the backend can give them (`capture_scored`: an engine-side backend captures without them)."""
    score = scores.batch(group) if scores is not None else {}
    if scores is None or not score or not hasattr(backend, "capture_scored"):
        return backend.capture(batch, plan)
    states, scored = backend.capture_scored(batch, plan, score)
    scores.add(group, numbers, scored)
    return states
