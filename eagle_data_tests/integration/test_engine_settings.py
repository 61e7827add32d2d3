"""Each engine setting is declared once (its `EngineSettings` field): the Dagster resource's fields, their
descriptions in the UI's config schema, the environment's reading and the refusals all derive from it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import dagster as dg
import pytest

from eagle_data.defs.resources import EngineResource
from eagle_data.engines import ENGINE_ENV, OPTIONAL_SETTINGS, SETTINGS, EngineSettings, from_environment
from eagle_data.types import ConfigError


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for setting in SETTINGS.values():
        if setting.env:
            monkeypatch.delenv(setting.env, raising=False)
    return monkeypatch


def test_every_setting_is_one_field_of_the_resource_with_its_description_in_dagsters_schema() -> None:
    assert list(SETTINGS) == [f.name for f in fields(EngineSettings)]
    defs = dg.Definitions(resources={"engine": EngineResource()})
    schema = defs.get_repository_def().get_top_level_resources()["engine"].config_schema
    shown = schema.as_field().config_type.fields  # what the UI's launchpad and resource page list
    assert list(shown) == [s.config_name(name) for name, s in SETTINGS.items()]
    for name, setting in SETTINGS.items():
        description = shown[setting.config_name(name)].description or ""
        assert setting.description in description and setting.env in description, (name, description)
        assert not shown[setting.config_name(name)].is_required
    assert "base_url" not in shown and "Never the value" in shown["base_url_env"].description


def test_the_environment_gives_every_declared_variable_parsed(env: pytest.MonkeyPatch) -> None:
    given = {ENGINE_ENV: "openrouter", "EAGLE_DATA_MODEL": "m", "EAGLE_DATA_BASE_URL": "http://127.0.0.1:9/v1",
             "EAGLE_DATA_TIMEOUT_S": "30", "EAGLE_DATA_CONNECT_TIMEOUT_S": "2.5", "EAGLE_DATA_MAX_IN_FLIGHT": "64",
             "EAGLE_DATA_PROVIDER": '{"sort": "price"}', "EAGLE_DATA_REASONING": '{"effort": "high"}',
             "EAGLE_DATA_BATCH_SIZE": "8", "EAGLE_DATA_THREADS": "1"}  # fmt: skip
    assert set(given) == {s.env for s in SETTINGS.values() if s.env}  # a new variable: add it here
    for variable, text in given.items():
        env.setenv(variable, text)
    assert from_environment() == {
        "kind": "openrouter", "model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key_env": None,
        "timeout_s": 30.0, "connect_timeout_s": 2.5, "max_in_flight": 64, "provider": {"sort": "price"},
        "reasoning": {"effort": "high"}, "batch_size": 8, "threads": 1,
    }  # fmt: skip
    assert EngineSettings(**from_environment()).max_in_flight == 64


@pytest.mark.parametrize(
    ("variable", "text", "line"),
    [("EAGLE_DATA_TIMEOUT_S", "1m", "EAGLE_DATA_TIMEOUT_S='1m' is not a number: give e.g. EAGLE_DATA_TIMEOUT_S=120"),
     ("EAGLE_DATA_MAX_IN_FLIGHT", "0", "EAGLE_DATA_MAX_IN_FLIGHT must be > 0, got 0"),
     ("EAGLE_DATA_PROVIDER", "[1]", 'EAGLE_DATA_PROVIDER must be a JSON object, e.g. {"sort": "price"}')],
)  # fmt: skip
def test_a_bad_environment_value_is_a_one_line_user_error(
    env: pytest.MonkeyPatch, variable: str, text: str, line: str
) -> None:
    """These were ValueErrors: a bug's class path and traceback in the UI for a typo in a variable."""
    env.setenv(ENGINE_ENV, "openai")
    env.setenv(variable, text)
    with pytest.raises(ConfigError) as err:
        EngineResource().settings()
    assert str(err.value) == line


def test_a_setting_a_kind_may_refuse_names_its_variable_and_its_run_config_field() -> None:
    assert {name: s.env for name, s in SETTINGS.items() if s.optional} == OPTIONAL_SETTINGS
    assert {"kind", "model", "max_in_flight"}.isdisjoint(OPTIONAL_SETTINGS)
    from eagle_data.engines import lookup

    line = lookup("local").refused(EngineSettings(kind="local", base_url="http://127.0.0.1:9"))
    assert line == (
        "engine local takes no base_url setting: unset EAGLE_DATA_BASE_URL or remove base_url_env from the "
        "engine's run config"
    )


def test_the_local_kinds_batch_size_reaches_the_engine_and_its_in_flight_ceiling_fills_two_batches(
    env: pytest.MonkeyPatch, demo_model: Path
) -> None:
    from eagle_data.engines import build_engine, lookup
    from eagle_data.standins.openai_fake import spec_for_tests

    local = lookup("local")
    assert local.in_flight(EngineSettings(kind="local")) == 32  # two batches of the default 16
    assert local.in_flight(EngineSettings(kind="local", batch_size=40)) == 80
    assert local.in_flight(EngineSettings(kind="local", batch_size=40, max_in_flight=5)) == 5  # the setting wins
    settings = EngineSettings(kind="local", model=str(demo_model), batch_size=4, threads=1)
    engine = build_engine(settings, spec_for_tests())
    assert (engine.batch_size, engine.threads) == (4, 1)
    assert lookup("openai").refused(EngineSettings(kind="openai", batch_size=4)) == (
        "engine openai takes no batch_size setting: unset EAGLE_DATA_BATCH_SIZE or remove batch_size from the "
        "engine's run config"
    )
