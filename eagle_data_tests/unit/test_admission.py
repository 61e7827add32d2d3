"""The export's gate as a pure function over plain records (`exports.admit`): no Dagster, no storage."""

from __future__ import annotations

import pytest

from eagle_data.exports import Evaluation, GateRecords, Materialization, admit

CHECKS = ("empty_response", "token_structure")
RUN_A, RUN_B = "aaaaaaaa-1111", "bbbbbbbb-2222"


def shard(partition: str, run: str = RUN_A, sha: str | None = "sha-0") -> Materialization:
    return Materialization(partition, run, sha)


def passed(check: str, partition: str, run: str = RUN_A, judged: str = RUN_A, sha: str = "sha-0") -> Evaluation:
    return Evaluation(check, partition, run, passed=True, judged_run_id=judged, shard_sha256=sha)


def records(materializations: list[Materialization], evaluations: list[Evaluation], stored: set[str] | None = None):
    latest = {m.partition: m for m in materializations}
    return GateRecords(
        blocking=CHECKS,
        on_storage=frozenset(latest if stored is None else stored),
        materializations=latest,
        evaluations={(e.check, e.partition): e for e in evaluations},
    )


def every_check_passed(partition: str, **kwargs: str) -> list[Evaluation]:
    return [passed(check, partition, **kwargs) for check in CHECKS]


def test_a_shard_every_blocking_check_passed_on_its_latest_materialization_is_admitted_with_its_digest() -> None:
    gate = admit(records([shard("00000"), shard("00001", sha="sha-1")],
                         every_check_passed("00000") + every_check_passed("00001", sha="sha-1")))  # fmt: skip
    assert gate.admitted == ("00000", "00001") and gate.excluded == {}
    assert gate.digests == {"00000": "sha-0", "00001": "sha-1"}


def test_checks_of_a_later_run_judging_the_same_materialization_admit_it() -> None:
    """The Checks tab's "Execute all": another run judged run A's materialization."""
    gate = admit(records([shard("00000")], every_check_passed("00000", run=RUN_B)))
    assert gate.admitted == ("00000",)


@pytest.mark.parametrize(
    ("judged", "sha"),
    [(RUN_A, "sha-0"), (RUN_B, "sha-old")],  # an earlier run's materialization; a digest of other bytes
    ids=["earlier-run", "other-bytes"],
)
def test_a_check_that_judged_another_materialization_keeps_the_shard_out(judged: str, sha: str) -> None:
    latest = shard("00000", run=RUN_B) if judged == RUN_A else shard("00000", run=RUN_B, sha="sha-new")
    evaluations = [passed("empty_response", "00000", judged=judged, sha=sha), passed("token_structure", "00000",
                   run=RUN_B, judged=RUN_B, sha=latest.shard_sha256 or "")]  # fmt: skip
    gate = admit(records([latest], evaluations))
    assert gate.admitted == ()
    assert gate.excluded == {
        "00000": "empty_response last ran on an earlier materialization of this shard; re-run the checks"
    }


def test_each_shard_of_a_range_gets_its_own_reason() -> None:
    failing = Evaluation("empty_response", "00001", RUN_A, passed=False, judged_run_id=RUN_A, shard_sha256="sha-0",
                         description="shard 00001: 87% empty\nmore")  # fmt: skip
    planned = Evaluation("token_structure", "00002", RUN_B, passed=None)
    evaluations = [
        *every_check_passed("00000"),
        failing,
        passed("token_structure", "00001"),
        passed("empty_response", "00002"),
        planned,
    ]
    gate = admit(records([shard("00000"), shard("00001"), shard("00002")], evaluations))
    assert gate.admitted == ("00000",)
    assert gate.excluded == {
        "00001": "empty_response failed in run aaaaaaaa: shard 00001: 87% empty",
        "00002": "token_structure has no result for this shard (run bbbbbbbb did not finish it); re-run the checks",
    }


def test_shards_missing_a_file_a_materialization_a_digest_or_a_check_are_named() -> None:
    materializations = [shard("00000"), shard("00002", sha=None), shard("00003")]
    gate = admit(records(materializations, [passed("empty_response", "00003")], stored={"00001", "00002", "00003"}))
    assert gate.admitted == ()
    assert gate.excluded == {
        "00000": "its shard file is missing from storage; re-materialize it",
        "00001": "this Dagster instance has no materialization of it; materialize it here",
        "00002": "its materialization has no shard digest (an older version made it); re-materialize",
        "00003": "token_structure never ran on this shard; run the checks",
    }
