"""The OpenAI-compatible engine: error sorting, response parsing, OpenRouter extras, secrets, pre-flight."""

from __future__ import annotations

import ast
import asyncio
import json
import socket
import time
import tomllib
from pathlib import Path

import pytest

from eagle_data.engines import make_engine
from eagle_data.engines.openai_compat import OpenAICompatEngine
from eagle_data.engines.openai_protocol import http_error, parse_response
from eagle_data.engines.openrouter_key import check_credit
from eagle_data.engines.served import ModelMismatchError
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.run import NothingAnswered
from eagle_data.secrets import mask_url, redact
from eagle_data.standins.local import free_port
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.types import AbortError, Completion, FatalError, RetryableError, UserError

SECRET = "sk-or-v1-TEST-SECRET-7f3a9c"


def _err(status: int, message: str = "m", reason: str = "") -> bytes:
    return json.dumps({"error": {"code": status, "message": message, "metadata": {"reason": reason}}}).encode()


# ---- error sorting -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "kind", "throttle"),
    [
        (408, "http_408", False),
        (409, "http_409", False),
        (425, "http_425", False),
        (429, "http_429", True),
        (500, "http_500", False),
        (502, "http_502", False),
        (503, "http_503", False),
    ],
)
def test_retryable_statuses(status: int, kind: str, throttle: bool) -> None:
    err = http_error(status, _err(status), None, 0.0)
    assert isinstance(err, RetryableError) and err.kind == kind and err.throttle is throttle


def test_503_with_retry_after_is_a_throttle_and_carries_the_wait() -> None:
    err = http_error(503, _err(503), "7", 0.0)
    assert isinstance(err, RetryableError) and err.throttle and err.retry_after == 7.0


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_fail_fast_with_the_servers_message(status: int) -> None:
    err = http_error(status, _err(status, "model xyz is not a valid model ID"), None, 0.0)
    assert isinstance(err, FatalError) and err.kind == f"http_{status}" and "not a valid model ID" in str(err)


@pytest.mark.parametrize(("status", "stops"), [(401, True), (403, True), (404, True), (400, False), (422, False)])
def test_errors_that_every_later_request_would_hit_are_their_own_class(status: int, stops: bool) -> None:
    err = http_error(status, _err(status), None, 0.0)
    assert isinstance(err, FatalError) and isinstance(err, AbortError) is stops
    budget = http_error(402, _err(402, "too heavy", "weight_exceeds_budget"), None, 0.0)
    assert isinstance(budget, AbortError)


@pytest.mark.parametrize(("status", "stops"), [(401, True), (404, True), (400, False)])
def test_a_run_stops_on_a_refused_key_or_model_by_its_class_and_a_bad_request_fails_only_its_prompt(
    server: FakeOpenAI, tmp_path: Path, status: int, stops: bool
) -> None:
    server.faults = Faults(force_status=status)
    engine = make_engine("openai", model="m", base_url=f"http://127.0.0.1:{server.port}/v1")
    settings = RunnerSettings(progress_bar=False, max_in_flight=1, initial_in_flight=1, min_in_flight=1)
    with pytest.raises(FatalError if stops else NothingAnswered) as err:
        run_generation(engine, spec_for_tests(), prompt_shards(1, 10), ShardStore(str(tmp_path)), settings=settings,
                       log=lambda line: None)  # fmt: skip
    assert "\n" not in str(err.value) and f"http_{status}" in str(err.value)
    assert server.received == (1 if stops else 10)  # stopped after the first answer, or every prompt asked once


def test_a_servers_multi_line_error_text_becomes_one_line() -> None:
    text = "1 validation error for ChatCompletionRequest\nmessages\n  Field required [type=missing]"  # vLLM's shape
    err = http_error(400, _err(400, text), None, 0.0)
    assert isinstance(err, UserError) and "\n" not in str(err) and "messages   Field required" in str(err)


def test_the_openai_sdk_is_declared_only_if_the_engine_imports_it() -> None:
    """Measured below the throughput floor (docs/facts.md), the SDK is not the client; a dependency nothing
    imports is not declared."""
    root = Path(__file__).resolve().parents[2]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    imported = set()
    for path in (root / "eagle_data").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert any(d.split(">")[0].split("=")[0].strip() == "openai" for d in declared) is ("openai" in imported)


def test_402_in_flight_budget_waits_but_weight_exceeds_budget_fails() -> None:
    waits = http_error(402, _err(402, "busy", "in_flight_budget_exhausted"), "2", 0.0)
    fails = http_error(402, _err(402, "too heavy", "weight_exceeds_budget"), None, 0.0)
    assert isinstance(waits, RetryableError) and waits.throttle and waits.retry_after == 2.0
    assert isinstance(fails, FatalError) and fails.kind == "http_402_budget" and "too heavy" in str(fails)


def test_a_200_with_an_error_body_or_finish_error_is_a_failed_attempt() -> None:
    with pytest.raises(RetryableError, match="died") as body:
        parse_response(200, _err(502, "provider died"))
    assert body.value.kind == "body_error"
    finish = {"choices": [{"message": {"content": "x"}, "finish_reason": "error"}]}
    with pytest.raises(RetryableError) as fin:
        parse_response(200, json.dumps(finish).encode())
    assert fin.value.kind == "finish_error"
    with pytest.raises(RetryableError) as bad:
        parse_response(200, b"<html>gateway</html>")
    assert bad.value.kind == "bad_json"


def test_parse_reads_reasoning_usage_cost_and_provider() -> None:
    body = {
        "provider": "DeepInfra",
        "choices": [{"finish_reason": "length", "message": {"content": "hi", "reasoning_content": "hmm"}}],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": 7,
            "cost": 0.0021,
            "completion_tokens_details": {"reasoning_tokens": 3},
        },
    }
    done = parse_response(200, json.dumps(body).encode())
    assert done == Completion(
        content="hi",
        reasoning="hmm",
        finish_reason="length",
        prompt_tokens=11,
        completion_tokens=7,
        reasoning_tokens=3,
        cost_usd=0.0021,
        provider="DeepInfra",
    )
    assert done.truncated


# ---- request shape -------------------------------------------------------------------------------------
def test_openrouter_request_carries_routing_and_reasoning_but_config_has_no_url_or_key() -> None:
    provider = {
        "ignore": ["Fireworks"],
        "quantizations": ["fp8", "bf16"],
        "allow_fallbacks": False,
        "sort": "price",
    }
    engine = make_engine("openrouter", model="qwen/qwen3-8b", provider=provider, thinking=True, max_tokens=8192)
    cfg = engine.config()
    assert cfg["provider"] == provider and cfg["reasoning"] == {"enabled": True} and cfg["max_tokens"] == 8192
    assert "openrouter.ai" not in json.dumps(cfg) and "api_key" not in json.dumps(cfg)
    local = make_engine("openai", model="m", base_url="http://127.0.0.1:30000/v1", thinking=False)
    assert local.config()["chat_template_kwargs"] == {"enable_thinking": False}


def test_openai_without_a_base_url_never_falls_back_to_another_provider() -> None:
    with pytest.raises(FatalError, match="engine openai needs a base URL: set EAGLE_DATA_BASE_URL"):
        make_engine("openai", model="m", api_key_env="OPENAI_API_KEY")


def test_unknown_provider_or_reasoning_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="provider: unknown keys \\['ignored'\\]"):
        OpenAICompatEngine(model="m", provider={"ignored": ["x"]})
    with pytest.raises(ValueError, match="reasoning"):
        OpenAICompatEngine(model="m", reasoning={"budget": 3})
    with pytest.raises(FatalError, match="unknown engine kind 'tgi': set EAGLE_DATA_ENGINE to one of"):
        make_engine("tgi", model="m")


# ---- real HTTP -----------------------------------------------------------------------------------------
def error_kind(base_url: str, timeout_s: float, connect_timeout_s: float = 10.0) -> str:
    """The `kind` of the RetryableError one request raises, or "ok"."""

    async def attempt() -> str:
        engine = OpenAICompatEngine(model="m", base_url=base_url, timeout_s=timeout_s,
                                    connect_timeout_s=connect_timeout_s)  # fmt: skip
        try:
            await engine.complete([{"role": "user", "content": "q"}], prompt_id="p")
        except RetryableError as exc:
            return exc.kind
        finally:
            await engine.aclose()
        return "ok"

    return asyncio.run(attempt())


def test_timeouts_and_resets_come_back_as_retryable_kinds(server: FakeOpenAI) -> None:
    url = f"http://127.0.0.1:{server.port}/v1"
    for faults, kind in [(Faults(p_hang=1.0, hang_s=5), "timeout"), (Faults(p_reset=1.0), "reset"), (Faults(), "ok")]:
        server.faults = faults
        assert error_kind(url, timeout_s=0.3) == kind


def test_a_closed_port_is_a_connect_error() -> None:
    assert error_kind(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2) == "connect"


def test_a_host_that_never_completes_the_handshake_fails_within_the_connect_timeout_not_the_read_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepts; once its queue is full, new handshakes go unanswered like a dead host
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        started = time.monotonic()
        try:
            kind = error_kind(f"http://127.0.0.1:{port}/v1", timeout_s=60, connect_timeout_s=0.5)
        finally:
            for filler in fillers:
                filler.close()
    assert kind == "connect_timeout" and time.monotonic() - started < 30  # the read timeout is 60


@pytest.mark.parametrize("url", ["127.0.0.1:30000/v1", "ftp://host/v1", "http:///v1", "http://host:port/v1"])
def test_a_malformed_base_url_is_a_one_line_config_error_before_any_request(url: str) -> None:
    with pytest.raises(FatalError, match="is not an http\\(s\\) URL with a host: set EAGLE_DATA_BASE_URL") as err:
        OpenAICompatEngine(model="m", base_url=url)
    assert err.value.kind == "config" and "\n" not in str(err.value)


def test_url_credentials_are_masked_and_an_echoed_key_is_redacted() -> None:
    assert mask_url("http://user:pw@host:1/v1") == "http://***@host:1/v1" and mask_url("http://h/v1") == "http://h/v1"
    assert redact("bad key sk-123456 (got Bearer sk-123456)", ["sk-123456", ""]) == "bad key *** (got Bearer ***)"
    engine = OpenAICompatEngine(model="m", base_url="http://user:pw-secret@127.0.0.1:1/v1")
    assert "pw-secret" not in engine.describe() + json.dumps(engine.config()) + repr(engine.__dict__.get("shown"))


def test_missing_key_stops_the_run_before_sending(
    server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EAGLE_TEST_KEY", raising=False)
    engine = make_engine(
        "openrouter",
        model="m",
        base_url=f"http://127.0.0.1:{server.port}/api/v1",
        api_key_env="EAGLE_TEST_KEY",
    )
    with pytest.raises(FatalError, match="EAGLE_TEST_KEY is empty"):
        run_generation(
            engine,
            spec_for_tests(),
            prompt_shards(1, 20),
            ShardStore(str(tmp_path)),
            settings=RunnerSettings(progress_bar=False),
            log=lambda line: None,
        )
    assert server.received == 0


def test_secret_key_is_used_but_never_logged_stored_or_reported(
    server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EAGLE_TEST_KEY", SECRET)
    server.faults = Faults(p_5xx=0.2, p_error_body=0.1)  # errors get logged: they must not leak the key either
    base = f"http://127.0.0.1:{server.port}/api/v1"
    engine = make_engine("openrouter", model="m", base_url=base, api_key_env="EAGLE_TEST_KEY")
    lines: list[str] = []
    reports = run_generation(
        engine,
        spec_for_tests(),
        prompt_shards(2, 50),
        ShardStore(str(tmp_path)),
        settings=RunnerSettings(backoff_base_s=0.01, backoff_cap_s=0.05),
        log=lines.append,
    )
    info = check_credit(base, "EAGLE_TEST_KEY")
    assert server.auth_headers == {f"Bearer {SECRET}"}  # the key was really sent
    assert (info.limit_usd, info.remaining_usd) == (100.0, 87.5) and "$87.50 credit left" in info.line()
    exposed = [
        *lines,
        json.dumps([r.figures.to_metadata() for r in reports.values()]),
        json.dumps(engine.config()),
        repr(engine),
        repr(info),
        info.line(),
        *capsys.readouterr(),
    ]
    assert not [text for text in exposed if SECRET in text]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and not [p for p in files if SECRET.encode() in p.read_bytes()]


def test_check_credit_refuses_a_bad_key_with_the_servers_message(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLE_TEST_KEY", SECRET)
    server.faults = Faults(force_status=401)
    with pytest.raises(FatalError, match="HTTP 401: User not found"):
        check_credit(f"http://127.0.0.1:{server.port}/api/v1", "EAGLE_TEST_KEY")


def test_openrouter_preflight_reports_credit_and_refuses_an_empty_key(
    server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLE_TEST_KEY", SECRET)
    base = f"http://127.0.0.1:{server.port}/api/v1"
    lines: list[str] = []
    settings = RunnerSettings(progress_bar=False)
    engine = make_engine("openrouter", model="m", base_url=base, api_key_env="EAGLE_TEST_KEY")
    run_generation(engine, spec_for_tests(), prompt_shards(1, 3), ShardStore(str(tmp_path / "a")), settings=settings,
                   log=lines.append)  # fmt: skip
    assert lines[1] == "OpenRouter key: $87.50 credit left of $100.00 ($12.50 used)"
    sent = server.received
    server.faults = Faults(key_usage=100.0)
    engine = make_engine("openrouter", model="m", base_url=base, api_key_env="EAGLE_TEST_KEY")
    with pytest.raises(FatalError, match=r"\$0\.00 credit left of \$100\.00.*add credit"):
        run_generation(engine, spec_for_tests(), prompt_shards(1, 3), ShardStore(str(tmp_path / "b")),
                       settings=settings, log=lines.append)  # fmt: skip
    assert server.received == sent  # nothing spent once the credit is gone


# ---- the served model --------------------------------------------------------------------------------
def test_an_openai_server_serving_another_model_stops_the_run_before_sending(server: FakeOpenAI, tmp_path: Path):
    server.faults = Faults(served_models=("meta-llama/Llama-3.1-8B", "a", "b", "c"))
    engine = make_engine("openai", model="Qwen/Qwen3-8B", base_url=f"http://u:pw-secret@127.0.0.1:{server.port}/v1")
    with pytest.raises(ModelMismatchError) as err:
        run_generation(engine, spec_for_tests(), prompt_shards(1, 3), ShardStore(str(tmp_path)),
                       settings=RunnerSettings(progress_bar=False), log=lambda line: None)  # fmt: skip
    message = str(err.value)
    assert "\n" not in message and "pw-secret" not in message and f"http://***@127.0.0.1:{server.port}/v1" in message
    assert "'meta-llama/Llama-3.1-8B', 'a', 'b' and 1 more, not 'Qwen/Qwen3-8B'" in message
    assert "EAGLE_DATA_MODEL" in message and server.received == 0


@pytest.mark.parametrize("served", [(), ("/models/Qwen3-8B",), ("other", "Qwen/Qwen3-8B")])
def test_an_openai_server_listing_the_model_or_none_is_accepted(server: FakeOpenAI, served: tuple[str, ...]):
    server.faults = Faults(served_models=served)
    engine = make_engine("openai", model="Qwen/Qwen3-8B", base_url=f"http://127.0.0.1:{server.port}/v1")
    assert asyncio.run(engine.check()).endswith("reachable, model Qwen/Qwen3-8B")


def test_a_black_hole_server_is_named_as_silent_with_the_settings_that_exist() -> None:
    """#34: a server that takes the connection and never answers was met with a hint at the engine resource's
    `base_url`, a run-config field that no longer exists (the resource takes `base_url_env`)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the handshake; nothing ever reads or answers
        engine = make_engine("openai", model="m", base_url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
                             timeout_s=0.5)  # fmt: skip
        with pytest.raises(FatalError) as err:
            asyncio.run(engine.check())
    message = str(err.value)
    assert "sent no answer to GET /models within 0.5 s" in message and "\n" not in message
    assert "EAGLE_DATA_BASE_URL" in message and "raise EAGLE_DATA_TIMEOUT_S above 0.5" in message
    assert "resource's base_url" not in message and err.value.kind == "unreachable"


def test_a_closed_port_at_check_names_the_url_setting_not_a_resource_field() -> None:
    engine = make_engine("openai", model="m", base_url=f"http://127.0.0.1:{free_port()}/v1", timeout_s=2)
    with pytest.raises(FatalError, match="start the server, or fix EAGLE_DATA_BASE_URL \\(or the variable") as err:
        asyncio.run(engine.check())
    assert "resource's base_url" not in str(err.value)


def test_openrouter_takes_routing_variants_its_model_list_leaves_out(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLE_TEST_KEY", SECRET)
    server.faults = Faults(served_models=("qwen/qwen3-8b",))
    base = f"http://127.0.0.1:{server.port}/api/v1"
    engine = make_engine("openrouter", model="qwen/qwen3-8b:nitro", base_url=base, api_key_env="EAGLE_TEST_KEY")
    assert "credit left" in asyncio.run(engine.check())


def test_the_timeout_bounds_the_whole_request_even_when_the_server_drips_bytes(server: FakeOpenAI) -> None:
    """#20: a reply sent one byte at a time (never a long gap between reads) used to run past the timeout."""
    server.faults = Faults(drip_s=0.05)  # a ~600-byte reply takes ~30 s
    started = time.monotonic()
    assert error_kind(f"http://127.0.0.1:{server.port}/v1", timeout_s=1) == "timeout"
    assert time.monotonic() - started < 10  # far below the reply's 30 s: a loaded box cannot make it fail
