"""Every check eagle_data runs, declared once: which asset it judges, its severity, whether it blocks, what it
says in the UI, whether a failure is announced and what the nightly repair re-runs when it fails.

Pure data, no Dagster: the quality gates (`quality.gates`), the capture checks (`drafter.verify`), the
estimate's `within_budget` and `canary`, `decontamination` and `trainer_parity` take their declarations from
here, and `eagle_data/defs` derives the asset check specs, the alert sensors and the repair schedules from it.
Each check is evaluated by one judge (the code that produces its verdicts); `implemented` ties a judge's
code to its declarations, so a declared check without code (or code without a declaration) fails at import.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

Severity = Literal["ERROR", "WARN"]
# The stage whose asset a check judges: `{ds}_estimate`, `{ds}_validated`, `training_mix`, `hidden_states`.
Stage = Literal["estimate", "validated", "training_mix", "hidden_states"]
# The code that evaluates a check: the quality gates of a validated shard (also the canary's), the estimate,
# the benchmark decontamination of a validated shard, the trainer-parity run of the exports, capture verification,
# the target's own score of a validated shard's sampled rows.
Judge = Literal["gates", "estimate", "decontamination", "parity", "capture", "on_policy"]
Repair = Literal["checks", "none"]  # what the nightly repair re-runs on a shard whose check failed
STAGE_ASSETS = {"estimate": "{ds}_estimate", "validated": "{ds}_validated"}  # the other stages: one asset each


class RegistryError(ValueError):
    """A check declaration the rest of the project could not honour."""


@dataclass(frozen=True)
class CheckDef:
    """What a check is, independent of any data: enough to declare, alert on and repair it."""

    name: str
    stage: Stage
    judge: Judge
    severity: Severity
    blocking: bool  # a failure stops the steps downstream in its run, and exports leave the shard out
    description: str
    alert: bool  # a failure posts a message (the alert sensor); otherwise it shows in the UI and the report
    repair: Repair = "none"

    @property
    def asset(self) -> str:
        """The asset it judges, as the docs name it (`{ds}_validated`, `training_mix`)."""
        return STAGE_ASSETS.get(self.stage, self.stage)


def _gate(name: str, severity: Severity, blocking: bool, description: str) -> CheckDef:
    """A quality gate of `{ds}_validated`: an ERROR one alerts and is re-judged by the nightly repair
    (after a threshold change a shard may pass; a real regression fails and alerts again)."""
    error = severity == "ERROR"
    return CheckDef(name, "validated", "gates", severity, blocking, description, error, "checks" if error else "none")


def _capture(name: str, description: str) -> CheckDef:
    """A blocking check of `hidden_states` (re-capture costs GPU time: repaired by hand, never nightly)."""
    return CheckDef(name, "hidden_states", "capture", "ERROR", True, description, alert=True)


CHECKS: tuple[CheckDef, ...] = (
    _gate(
        "empty_response", "ERROR", True,
        "Empty-reply regression: too many short loss masks, one loss-mask sum dominating, or one completion "
        "repeated across prompts.",
    ),
    _gate("token_structure", "ERROR", True, "Every row's special-token structure and round-trip are valid."),
    _gate(
        "lost_text", "ERROR", True,
        "Token accounting: replies whose text holds fewer tokens than the engine reported generating "
        "(special tokens stripped, reasoning in a field not read, a cut stream).",
    ),
    _gate("truncation_rate", "WARN", False, "Share of replies cut at max_tokens."),
    _gate(
        "failed_rate", "ERROR", True,
        "Share of requests that failed after retries: a shard of failures is not done, however good its few "
        "answered rows.",
    ),
    _gate("reasoning_present", "ERROR", False, "Replies carry reasoning when thinking is on."),
    _gate("length_shift", "WARN", False, "Average completion length against the shard's last materialization."),
    _gate(
        "loops", "ERROR", True,
        "Replies that loop: half or more of a reply's 8-token phrases repeat earlier ones (a model's degenerate "
        "repetition); looping rows are set aside with the verdict `loop`.",
    ),
    CheckDef(
        "decontamination", "validated", "decontamination", "ERROR", True,
        "No row kept for training overlaps a benchmark item (exact after normalization, or a shared n-gram); "
        "overlapping rows are set aside with the verdict `contaminated`.",
        alert=True, repair="checks",
    ),
    CheckDef(
        "on_policy", "validated", "on_policy", "ERROR", True,
        "The target's own top-1 agreement with, and log-probability of, the supervised tokens of a sample of rows "
        "are not surely below what its sampling distribution predicts at the run's temperature and top_p; a "
        "failure names the likely cause (rendering, thinking mismatch, replies not the target's).",
        alert=True, repair="checks",
    ),
    CheckDef(
        "within_budget", "estimate", "estimate", "ERROR", True,
        "The projected tokens and dollars fit the catalog's budgets; otherwise generation does not start.",
        alert=True,
    ),
    CheckDef(
        "canary", "estimate", "estimate", "ERROR", True,
        "A sample drawn across the dataset passes the quality gates and the truncation limit; otherwise "
        "generation does not start, in this run (skipped) and later ones under the same generation config "
        "(refused).", alert=True,
    ),
    CheckDef(
        "trainer_parity", "training_mix", "parity", "ERROR", True,
        "The trainer files load as our ids and masks in the trainer's own code (SpecForge 0.2.0); text "
        "exports' differences named by cause. Without SpecForge installed: a WARN \"not verified\", not blocking.",
        alert=True,
    ),
    _capture(
        "ids_match_mix",
        "Every captured row is stored in every format, and each stored sample's ids and loss mask equal its mix row.",
    ),
    _capture("finite", "No stored hidden-state value is NaN or infinite."),
    _capture(
        "shapes_match_target", "Each sample's states are [row length, layers, hidden size] of the target's config."
    ),
    _capture(
        "recapture_matches",
        "A seeded sample of rows, captured again one at a time, matches the stored states within the dtype's "
        "tolerance (plus fp8's bound for fp8 files).",
    ),
    _capture(
        "bytes_match_plan",
        "The bytes on disk are within 2% of hidden_state_plan's formula for the same samples and tokens.",
    ),
)  # fmt: skip


def problems(checks: Collection[CheckDef]) -> list[str]:
    """What makes a set of declarations unsound, one line each: a repeated name, or a blocking check that
    would stop a run without a word (not ERROR, or not alerted: the run-failure alert leaves runs stopped
    by a blocking check to the check's own alert; Dagster blocks on ERROR failures only)."""
    names = [c.name for c in checks]
    found = [f"check {n!r} is declared {names.count(n)} times" for n in sorted(set(names)) if names.count(n) > 1]
    for c in checks:
        if c.blocking and (c.severity != "ERROR" or not c.alert):
            found.append(f"check {c.name!r} blocks but is {c.severity}{'' if c.alert else ', not alerted'}")
        if c.repair == "checks" and not c.alert:
            found.append(f"check {c.name!r} is repaired nightly but its failure is never announced")
    return found


if bad := problems(CHECKS):
    raise RegistryError("; ".join(bad))
BY_NAME = {c.name: c for c in CHECKS}


def judged_by(judge: Judge) -> tuple[CheckDef, ...]:
    """The checks one judge evaluates, in declaration order."""
    return tuple(c for c in CHECKS if c.judge == judge)


def implemented(judge: Judge, names: Collection[str]) -> tuple[CheckDef, ...]:
    """The checks of `judge`, refusing a mismatch with the names its code evaluates: the one place a
    judge's code and the declarations meet, called where that code is defined."""
    declared = {c.name for c in judged_by(judge)}
    if missing := sorted(declared - set(names)):
        raise RegistryError(f"{judge}: declared check(s) {', '.join(missing)} have no code that judges them")
    if extra := sorted(set(names) - declared):
        raise RegistryError(f"{judge}: check(s) {', '.join(extra)} are judged but not declared in quality.registry")
    return judged_by(judge)


def check(name: str) -> CheckDef:
    """One declaration by name (names are unique across every stage)."""
    return BY_NAME[name]
