"""What the Dagster UI shows of a check on each shard: its latest execution, read from the instance's event log.

The package reads check outcomes from the stored quality records (the export's admission included); tests of
what Dagster records and shows (the capture checks' evaluations) read them here."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import dagster as dg

from eagle_data.defs.instance import judged
from eagle_data.defs.metadata import SHARD_DIGEST

PAGE = 1000  # check executions read per query


@dataclass(frozen=True)
class Evaluation:
    """The latest execution of one check on one shard, as Dagster recorded it."""

    passed: bool | None  # None: planned, no result yet
    judged_run_id: str | None = None  # the run of the materialization it names
    shard_sha256: str | None = None  # the digest of the shard bytes it judged (its metadata)
    description: str = ""


def latest_evaluations(
    instance: dg.DagsterInstance, checks: Sequence[dg.AssetCheckKey], partitions: Collection[str]
) -> dict[tuple[str, str], Evaluation]:
    """(check, partition) -> the latest execution of each check on each of `partitions`."""
    found: dict[tuple[str, str], Evaluation] = {}
    for key in checks:
        cursor, missing = None, set(partitions)
        while missing:
            page = instance.event_log_storage.get_asset_check_execution_history(key, limit=PAGE, cursor=cursor)
            for record in page:
                if record.partition in missing:
                    missing.discard(record.partition)
                    found[(key.name, record.partition)] = _evaluation(record)
            if len(page) < PAGE:
                break
            cursor = page[-1].id
    return found


def _evaluation(record: object) -> Evaluation:
    if (evaluation := judged(record)) is None:  # type: ignore[arg-type]
        return Evaluation(passed=None)
    target = evaluation.target_materialization_data
    digest = evaluation.metadata.get(SHARD_DIGEST)
    return Evaluation(
        passed=evaluation.passed,
        judged_run_id=target.run_id if target else None,
        shard_sha256=str(digest.value) if digest is not None else None,
        description=evaluation.description or "",
    )
