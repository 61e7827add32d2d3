"""The engine registry: a kind is one record; settings resolve at run time, run config over the environment."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from eagle_data.catalog import PROFILE_ENV, SamplingSetting, load_catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import ENGINE_ENV, POOL_ENV, EngineResource, StorageResource
from eagle_data.demo import DEMO_MODEL_ENV
from eagle_data.engines import SETTINGS, EngineKind, EngineSettings, build_engine, kinds, lookup, register
from eagle_data.runner import RunnerSettings
from eagle_data.standins.openai_fake import FakeOpenAI, spec_for_tests
from eagle_data.types import Completion, Engine, FatalError, Message
from eagle_data_tests.fixtures_stages import standin_demo

ENV = (POOL_ENV, PROFILE_ENV, DEMO_MODEL_ENV, *(s.env for s in SETTINGS.values() if s.env))


class EchoEngine(Engine):
    """Answers every conversation with its last user message."""

    name = "echo"

    def __init__(self, model: str) -> None:
        self.model = model

    def config(self) -> dict:
        return {"engine": self.name, "model": self.model}

    async def check(self) -> str:
        return "echo engine ready"

    async def complete(self, messages: list[Message], *, prompt_id: str) -> Completion:
        return Completion(content=f"echo: {messages[-1]['content']}", completion_tokens=3, provider="echo")

    async def aclose(self) -> None:
        """Nothing to release."""


register(EngineKind("echo", build=lambda s, spec: EchoEngine(s.model), make=EchoEngine, summary="echo"))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_kind_registered_in_one_line_runs_through_the_generation_asset_in_its_own_pool(env, tmp_path) -> None:
    env.setenv(ENGINE_ENV, "echo")
    env.setenv("EAGLE_DATA_MODEL", "echo-1")
    spec = standin_demo()["b7_sharegpt"]
    prompts, _, generation, _ = build_dataset_assets(spec)  # the estimate is not needed
    assert generation.op.pool == "echo"
    storage = StorageResource(root=str(tmp_path))
    result = dg.materialize([prompts, generation], partition_key="00000",
                            resources={**shard_resources(storage), "engine": EngineResource()})  # fmt: skip
    assert result.success
    rows = storage.store().read_shard(spec.name, spec.name, "00000")
    assert rows.height == 10 and set(rows["status"]) == {"ok"} and set(rows["engine"]) == {"echo"}
    assert all(content.startswith("echo: ") for content in rows["content"])
    metadata = result.asset_materializations_for_node(spec.name)[0].metadata
    assert metadata["engine"].value == "echo echo-1"


def test_run_config_overrides_the_environment_field_by_field_and_the_kind_stays(env) -> None:
    env.setenv(ENGINE_ENV, "openai")
    env.setenv("EAGLE_DATA_MODEL", "m")
    env.setenv("EAGLE_DATA_BASE_URL", "http://127.0.0.1:9/v1")
    env.setenv("EAGLE_DATA_TIMEOUT_S", "30")
    settings = EngineResource(timeout_s=5, connect_timeout_s=2).settings()
    assert settings == EngineSettings(kind="openai", model="m", base_url="http://127.0.0.1:9/v1", timeout_s=5,
                                      connect_timeout_s=2)  # fmt: skip
    assert EngineResource(model="other").settings().timeout_s == 30  # from the environment
    built = EngineResource().make(spec_for_tests())
    assert (built.timeout_s, built.connect_timeout_s) == (30, 10)  # the environment's timeout reaches the engine
    assert settings.key_env() == "OPENAI_API_KEY" and EngineResource(api_key_env="").settings().key_env() == ""


def test_run_config_names_the_variable_holding_the_base_url_never_the_url(env) -> None:
    env.setenv(ENGINE_ENV, "openai")
    env.setenv("OTHER_SERVER_URL", "http://127.0.0.1:8/v1")
    assert "base_url" not in EngineResource.model_fields  # run config cannot carry a URL (with a password)
    assert EngineResource(base_url_env="OTHER_SERVER_URL").settings().base_url == "http://127.0.0.1:8/v1"
    with pytest.raises(FatalError, match="run config base_url_env names UNSET_URL, which is empty") as err:
        EngineResource(base_url_env="UNSET_URL").settings()
    assert "\n" not in str(err.value)


def test_a_run_config_base_url_on_the_demo_profile_is_refused_not_ignored(env) -> None:
    env.setenv(PROFILE_ENV, "demo")
    env.setenv("OTHER_SERVER_URL", "http://127.0.0.1:8/v1")
    with pytest.raises(FatalError, match="the local engine of the demo profile serves in this process and takes no"):
        EngineResource(base_url_env="OTHER_SERVER_URL").settings()


def test_no_engine_chosen_is_a_one_line_error_and_the_demo_profile_runs_the_local_model(env) -> None:
    choices = "local, openai, openrouter, sglang, vllm"
    with pytest.raises(FatalError, match=f"^no engine chosen: set {ENGINE_ENV} to one of .*{choices}") as err:
        EngineResource().settings()
    assert "\n" not in str(err.value)
    env.setenv(PROFILE_ENV, "demo")
    env.setenv(DEMO_MODEL_ENV, "/opt/demo-model")
    assert EngineResource().settings() == EngineSettings(kind="local", model="/opt/demo-model")
    env.setenv(ENGINE_ENV, "local")  # .env.example's demo: the kind named, no model
    assert EngineResource().settings().model == "/opt/demo-model"
    assert EngineResource(model="/ckpt").settings().model == "/ckpt"


def test_the_local_kind_without_a_model_off_the_demo_profile_stops_instead_of_running_the_demo_model(env) -> None:
    env.setenv(ENGINE_ENV, "local")
    wanted = r"^engine local needs model: set EAGLE_DATA_MODEL .*EAGLE_DATA_PROFILE=demo"
    with pytest.raises(FatalError, match=wanted) as err:
        EngineResource().make(spec_for_tests())
    assert "\n" not in str(err.value) and err.value.kind == "config"


def test_a_run_config_kind_other_than_the_environments_is_refused_in_one_line_even_with_a_pool_named(env) -> None:
    env.setenv(ENGINE_ENV, "echo")
    env.setenv(POOL_ENV, "shared")  # every kind's generation steps would sit in this pool: no pool tells them apart
    env.setenv("EAGLE_DATA_MODEL", "echo-1")
    other = EngineResource(kind="openai", model="m")
    for ask in (other.settings, other.runner_settings, lambda: other.make(spec_for_tests())):
        with pytest.raises(FatalError, match=f"asks for engine openai, but this code location runs echo: set "
                                             f"{ENGINE_ENV}=openai and restart the code server") as err:  # fmt: skip
            ask()
        assert "\n" not in str(err.value) and err.value.kind == "config"
    assert EngineResource(kind="echo").settings().kind == "echo"  # repeating the environment's kind is fine
    env.delenv(ENGINE_ENV)
    with pytest.raises(FatalError, match="runs none: set EAGLE_DATA_ENGINE=openai"):
        other.settings()


@pytest.mark.parametrize("pool", ["", "shared"])
def test_a_run_config_kind_in_another_pool_fails_estimate_and_generation_before_any_request(
    env, tmp_path, server: FakeOpenAI, pool: str
) -> None:
    env.setenv(ENGINE_ENV, "echo")
    env.setenv(POOL_ENV, pool)
    spec = load_catalog(profile="demo")["b7_sharegpt"]
    prompts, estimate, generation, _ = build_dataset_assets(spec)
    env.setenv("EAGLE_DATA_BASE_URL", f"http://127.0.0.1:{server.port}/v1")
    engine = EngineResource(kind="openai", model="m", api_key_env="")
    resources = {**shard_resources(StorageResource(root=str(tmp_path))), "engine": engine}
    for step in (estimate, generation):
        result = dg.materialize([prompts, step], partition_key="00000", raise_on_error=False, resources=resources)
        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error.to_string()
        assert f"set {ENGINE_ENV}=openai and restart the code server" in failure
    assert server.received == 0


def test_runner_defaults_come_from_the_record_and_a_low_ceiling_is_no_contradiction(env) -> None:
    env.setenv(ENGINE_ENV, "openrouter")
    env.setenv("EAGLE_DATA_MODEL", "m")
    assert EngineResource().runner_settings().initial_in_flight == 32
    assert EngineResource().runner_settings().max_in_flight == lookup("openrouter").max_in_flight
    env.setenv(ENGINE_ENV, "sglang")
    sglang = EngineResource(max_in_flight=9).runner_settings()
    assert (sglang.max_in_flight, sglang.initial_in_flight) == (9, 9)
    low = RunnerSettings.in_flight(8, ramp=True)  # used to fail: "got 4, 32, 8"
    assert (low.min_in_flight, low.initial_in_flight, low.max_in_flight) == (4, 8, 8)
    assert {"local", "openai", "openrouter", "sglang", "vllm", "echo"} <= set(kinds())


def test_required_settings_are_named_with_the_variable_to_set() -> None:
    assert lookup("sglang").missing(EngineSettings(kind="sglang", model="m")) == (
        "engine sglang needs base_url: set EAGLE_DATA_BASE_URL to comma-separated http://host:port URLs "
        "(or one sglang-router URL)"
    )


@pytest.mark.parametrize(
    ("kind", "variable", "field", "value"),
    [("sglang", "EAGLE_DATA_PROVIDER", "provider", '{"sort": "price"}'),
     ("local", "EAGLE_DATA_REASONING", "reasoning", '{"effort": "high"}'),
     ("local", "EAGLE_DATA_TIMEOUT_S", "timeout_s", "30")],
)  # fmt: skip
def test_a_setting_the_kind_does_not_take_is_refused_in_one_line_never_dropped(
    env, kind: str, variable: str, field: str, value: str
) -> None:
    env.setenv(ENGINE_ENV, kind)
    env.setenv("EAGLE_DATA_MODEL", "m")
    if kind == "sglang":
        env.setenv("EAGLE_DATA_BASE_URL", "http://127.0.0.1:9")
    env.setenv(variable, value)
    with pytest.raises(FatalError, match=f"^engine {kind} takes no {field} setting: unset {variable} ") as err:
        EngineResource().make(spec_for_tests())
    assert "\n" not in str(err.value) and err.value.kind == "config"
    env.delenv(variable)
    with pytest.raises(FatalError, match=f"^engine {kind} takes no {field} setting: .*remove {field} from the engine"):
        EngineResource(**{field: json.loads(value)}).make(spec_for_tests())


def test_an_openrouter_setting_reaches_the_kinds_that_take_it(env) -> None:
    env.setenv(ENGINE_ENV, "openrouter")
    env.setenv("EAGLE_DATA_MODEL", "m")
    env.setenv("EAGLE_DATA_PROVIDER", '{"sort": "price"}')
    assert EngineResource().make(spec_for_tests()).config()["provider"] == {"sort": "price"}


def test_a_sampling_mixture_for_an_engine_that_cannot_take_one_is_refused_when_the_engine_is_built() -> None:
    spec = spec_for_tests()
    mixed = spec.model_copy(update={"generation": spec.generation.model_copy(update={"mixture": (
        SamplingSetting(name="cold", weight=1.0, temperature=0.2),)})})  # fmt: skip
    with pytest.raises(FatalError, match=r"^b7_sharegpt: engine echo takes no per-request sampling settings; remove"):
        build_engine(EngineSettings(kind="echo", model="e"), mixed)
    assert build_engine(EngineSettings(kind="echo", model="e"), spec).model == "e"


def test_a_run_config_base_url_is_refused_at_launch_before_dagster_stores_it() -> None:
    """Dagster stores run config as given: a URL field would put a `user:password@` in the run database.
    (The storage resource's nested S3 client settings are not run config at all.)"""
    config = {"base_url": "http://user:run-config-SECRET@127.0.0.1:9/v1"}

    @dg.asset
    def uses_both(storage: StorageResource, engine: EngineResource) -> None:
        """Nothing: the launch must fail before this runs."""

    with pytest.raises(dg.DagsterInvalidConfigError, match="unexpected config entry"):
        dg.materialize([uses_both], resources={**shard_resources(StorageResource()), "engine": EngineResource()},
                       run_config={"resources": {"engine": {"config": config}}})  # fmt: skip
