"""The Dagster side of the check registry (`eagle_data.quality.registry`): the asset check specs of a judge's
checks and the fields of one evaluation, as the registry declares them. Imports nothing of `defs`, so every
module that declares checks (the estimate's asset included) can take its specs from here.
"""

from typing import Any

import dagster as dg

from eagle_data.quality import registry


def check_specs(
    judge: registry.Judge, asset: str | dg.AssetKey, partitions_def: dg.PartitionsDefinition | None = None
) -> list[dg.AssetCheckSpec]:
    """The Dagster specs of every check one judge evaluates on `asset`, as the registry declares them."""
    return [
        dg.AssetCheckSpec(
            d.name, asset=asset, description=d.description, blocking=d.blocking, partitions_def=partitions_def
        )
        for d in registry.judged_by(judge)
    ]


def check_outcome(name: str, passed: bool, description: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """One evaluation's AssetCheckEvaluation fields, severity and blocking as the registry declares them."""
    d = registry.check(name)
    return {
        "check_name": name,
        "passed": passed,
        "severity": dg.AssetCheckSeverity(d.severity),
        "blocking": d.blocking,
        "description": description,
        "metadata": metadata,
    }
