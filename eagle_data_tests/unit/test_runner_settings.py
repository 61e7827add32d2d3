"""Runner settings that contradict each other say which setting to change, in one line."""

from __future__ import annotations

import pytest

from eagle_data.runner import RunnerSettings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_in_flight": 8}, "max_in_flight 8 is below initial_in_flight 32: raise max_in_flight or set "
                               "initial_in_flight <= 8"),
        ({"initial_in_flight": 2}, "initial_in_flight 2 is below min_in_flight 4: raise initial_in_flight or set "
                                   "min_in_flight <= 2"),
        ({"min_in_flight": 0}, "min_in_flight 0 is below 1: set min_in_flight >= 1"),
    ],
)  # fmt: skip
def test_contradicting_in_flight_limits_name_the_setting_to_change(settings: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        RunnerSettings(**settings)
    assert str(err.value) == f"runner settings: {message}"

