"""Every check the definitions hold is announced when it fails at ERROR severity: the alert sensor reads
the checks from the loaded definitions, so the capture's five checks and the exports' `trainer_parity`
post as the quality gates do (a hand-kept list left them out)."""

from __future__ import annotations

import dagster as dg
import pytest

from eagle_data.alerts import WEBHOOK_ENV
from eagle_data.catalog import load_catalog
from eagle_data.definitions import build_definitions
from eagle_data.standins.webhook import Receiver
from eagle_data_tests.test_quality_defs import FROM_START, tick


def test_every_check_of_the_definitions_is_alerted_on_when_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    defs = build_definitions(list(load_catalog(profile="demo").values()))
    checks = defs.get_repository_def().asset_graph.asset_check_keys
    assert {"hidden_states", "training_mix"} <= {key.asset_key.to_user_string() for key in checks}
    with dg.instance_for_test() as instance, Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        for key in checks:
            instance.report_runless_asset_event(
                dg.AssetCheckEvaluation(
                    asset_key=key.asset_key, check_name=key.name, passed=False,
                    severity=dg.AssetCheckSeverity.ERROR, description=f"{key.name} failed on purpose",
                )
            )  # fmt: skip
        tick(defs, instance, "quality_alerts", FROM_START)
        posted = " ".join(str(body) for body in receiver.bodies)
    missing = sorted(key.to_user_string() for key in checks if f"{key.name} failed on purpose" not in posted)
    assert missing == [], "failed checks that posted no alert"


def test_a_failed_warn_check_posts_no_alert(monkeypatch: pytest.MonkeyPatch) -> None:
    defs = build_definitions([load_catalog(profile="demo")["b7_sharegpt"]])
    with dg.instance_for_test() as instance, Receiver() as receiver:
        monkeypatch.setenv(WEBHOOK_ENV, receiver.url)
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey("b7_sharegpt_validated"), check_name="truncation_rate", passed=False,
                severity=dg.AssetCheckSeverity.WARN, description="truncation_rate failed on purpose",
            )
        )  # fmt: skip
        tick(defs, instance, "quality_alerts", FROM_START)
        assert receiver.bodies == []
