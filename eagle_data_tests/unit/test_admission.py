"""The export's gate as a pure function over the quality records' plain values (`exports.admit`): no Dagster,
no storage."""

from __future__ import annotations

from eagle_data.exports import GateRecords, StoredShard, admit
from eagle_data.quality.records import Judged
from eagle_data.storage.digests import FileDigest

CHECKS = ("empty_response", "token_structure")
RUN_A, RUN_B = "aaaaaaaa-1111", "bbbbbbbb-2222"
SHA0 = FileDigest("sha-0", 100)


def passed(check: str, sha: str = "sha-0", run: str = RUN_A) -> Judged:
    return Judged(check, True, "", sha, run)


def shard(*outcomes: Judged, digest: FileDigest | None = SHA0) -> StoredShard:
    return StoredShard(digest, {o.check: o for o in outcomes})


def every_check_passed(sha: str = "sha-0", run: str = RUN_A) -> list[Judged]:
    return [passed(check, sha, run) for check in CHECKS]


def records(shards: dict[str, StoredShard], stored: set[str] | None = None) -> GateRecords:
    return GateRecords(CHECKS, frozenset(shards if stored is None else stored), shards)


def test_a_shard_every_blocking_check_passed_on_its_stored_bytes_is_admitted_with_its_digest() -> None:
    sha1 = FileDigest("sha-1", 200)
    gate = admit(records({"00000": shard(*every_check_passed()), "00001": shard(*every_check_passed("sha-1"),
                                                                                  digest=sha1)}))  # fmt: skip
    assert gate.admitted == ("00000", "00001") and gate.excluded == {}
    assert gate.digests == {"00000": SHA0, "00001": sha1}


def test_checks_of_a_later_run_judging_the_same_bytes_admit_them() -> None:
    """The Checks tab's "Execute all", or a check judged in another run (decontamination): the same bytes."""
    gate = admit(records({"00000": shard(passed("empty_response"), passed("token_structure", run=RUN_B))}))
    assert gate.admitted == ("00000",)


def test_a_check_that_judged_other_bytes_keeps_the_shard_out() -> None:
    """A record rewritten by a later validation keeps an outcome judged on the earlier bytes: not these."""
    gate = admit(records({"00000": shard(passed("empty_response", sha="sha-old"), passed("token_structure"))}))
    assert gate.admitted == ()
    assert gate.excluded == {"00000": "empty_response last ran on other bytes of this shard; re-run the checks"}


def test_each_shard_of_a_range_gets_its_own_reason() -> None:
    failing = Judged("empty_response", False, "shard 00001: 87% empty\nmore", "sha-0", RUN_A)
    gate = admit(records({
        "00000": shard(*every_check_passed()),
        "00001": shard(failing, passed("token_structure")),
        "00002": shard(passed("empty_response")),
    }))  # fmt: skip
    assert gate.admitted == ("00000",)
    assert gate.excluded == {
        "00001": "empty_response failed in run aaaaaaaa: shard 00001: 87% empty",
        "00002": "token_structure never ran on this shard; run the checks",
    }


def test_shards_missing_a_file_a_record_or_a_digest_are_named() -> None:
    shards = {"00000": shard(*every_check_passed()), "00002": shard(*every_check_passed(), digest=None)}
    gate = admit(records(shards, stored={"00001", "00002"}))
    assert gate.admitted == ()
    assert gate.excluded == {
        "00000": "its shard file is missing from storage; re-materialize it",
        "00001": "it has no quality record of this version; re-run its checks",
        "00002": "its quality record holds no shard digest (an older version); re-run its checks",
    }
