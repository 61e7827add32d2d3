"""The check registry refuses declarations the rest of the project could not honour, and ties each judge's code
to its declarations: a check declared without code, or judged without a declaration, fails at import."""

from __future__ import annotations

from dataclasses import replace

import pytest

from eagle_data.drafter import verify
from eagle_data.quality import CHECKS, registry
from eagle_data_tests.integration.test_docs_match_code import ROOT, names, table


def test_the_registry_as_shipped_is_sound() -> None:
    assert registry.problems(registry.CHECKS) == []


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"severity": "WARN"}, "check 'canary' blocks but is WARN"),
        ({"alert": False}, "check 'canary' blocks but is ERROR, not alerted"),
    ],
)
def test_a_blocking_check_that_would_stop_a_run_without_a_word_is_refused(change: dict, said: str) -> None:
    """Dagster blocks on ERROR failures only, and the run-failure alert leaves a run a blocking check stopped to
    that check's own alert: a blocking check must be ERROR and alerted."""
    canary = replace(registry.check("canary"), **change)
    assert registry.problems([canary]) == [said]


def test_a_repeated_name_and_a_silent_repair_are_refused() -> None:
    gate = registry.check("length_shift")
    assert registry.problems([gate, gate]) == ["check 'length_shift' is declared 2 times"]
    assert registry.problems([replace(gate, repair="checks")]) == [
        "check 'length_shift' is repaired nightly but its failure is never announced"
    ]


def test_a_judge_whose_code_and_declarations_differ_is_refused() -> None:
    with pytest.raises(registry.RegistryError, match=r"declared check\(s\) finite have no code"):
        registry.implemented("capture", set(verify.CHECKS) - {"finite"})
    with pytest.raises(registry.RegistryError, match="nan_free are judged but not declared"):
        registry.implemented("capture", {*verify.CHECKS, "nan_free"})


def test_the_gates_and_the_capture_checks_are_the_registrys() -> None:
    assert registry.judged_by("gates") == CHECKS
    assert {d.name: d.description for d in registry.judged_by("capture")} == verify.CHECKS


def test_the_quality_doc_lists_the_registry_as_declared() -> None:
    rows = table(ROOT / "docs" / "quality.md", "check", "asset", "severity", "blocking", "alerted", "nightly repair")
    doc = [
        (names(r["check"])[0], names(r["asset"])[0], r["severity"], r["blocking"] == "yes", r["alerted"] == "yes",
         r["nightly repair"])
        for r in rows
    ]  # fmt: skip
    declared = [(d.name, d.asset, d.severity, d.blocking, d.alert, d.repair) for d in registry.CHECKS]
    assert doc == declared
