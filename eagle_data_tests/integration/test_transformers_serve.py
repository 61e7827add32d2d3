"""`transformers serve`, a real third-party OpenAI-compatible server (CPU), judged by the canary.

transformers 5.24's server parses a Qwen reply with a response template that ends the content at
`<|endoftext|>`, while its usage counts every generated token: a model that writes `<|endoftext|>` (not its
end-of-turn token, so generation goes on) gets back a fragment or nothing for a full bill. The lossy model
is the demo checkpoint with that token's logit raised above its end-of-turn one; the healthy one is the demo
checkpoint as it is. One server serves both (and SmolLM2), and a dataset goes through each with the openai
engine kind: the canary must name lost text for the first and must not for the second.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from eagle_data.catalog import load_catalog
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.estimate import CANARY
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import ENGINE_ENV, POOL_ENV, EngineResource, StorageResource
from eagle_data.standins.local import free_port

SAMPLE = 4  # canary prompts of the demo's
MAX_TOKENS = 12
END_OF_TEXT_LOGIT = 2.0  # against the random model's end-of-turn logit 0.7: it beats most text tokens, not all
START_TIMEOUT_S = 120


def _lossy_copy(demo_model: Path, folder: Path) -> Path:
    """The demo checkpoint whose output layer prefers `<|endoftext|>` over most text."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    shutil.copytree(demo_model, folder)
    weights = load_file(folder / "model.safetensors")
    row = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<|endoftext|>")
    weights["lm_head.weight"][row] = 0.0
    weights["lm_head.weight"][row, 0] = END_OF_TEXT_LOGIT  # feature 0: the demo's near-constant one
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _serve(home: Path) -> tuple[subprocess.Popen, str]:
    """`transformers serve` on a free port, loading the model a request names (offline)."""
    port = free_port()
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}  # one thread: a tiny model gains nothing from more, and they spin
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--device", "cpu"]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


def _wait(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"transformers serve exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{url}/health", timeout=1).close()
            return
        time.sleep(0.2)
    pytest.fail(f"transformers serve did not answer /health within {START_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `transformers serve` for every model of this file (it loads the one a request names): its base URL."""
    proc, url = _serve(tmp_path_factory.mktemp("transformers-serve"))
    try:
        _wait(proc, url)
        yield f"{url}/v1"
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def servers(serve_url: str, demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """{"lossy" | "healthy": (base URL, model folder)}, both on the one server."""
    lossy = _lossy_copy(demo_model, tmp_path_factory.mktemp("transformers-serve-lossy") / "lossy")
    return {"lossy": (serve_url, lossy), "healthy": (serve_url, demo_model)}


def _estimate(
    base_url: str, model: Path, root: Path, monkeypatch: pytest.MonkeyPatch, target: str = "auto"
) -> dg.ExecuteInProcessResult:
    """The demo's b7_sharegpt prompts and estimate (its canary) through the openai engine kind at `base_url`; with
    `target = "auto"` the target is the served checkpoint's own."""
    monkeypatch.setenv(ENGINE_ENV, "openai")
    monkeypatch.delenv(POOL_ENV, raising=False)
    monkeypatch.setenv("EAGLE_DATA_BASE_URL", base_url)
    spec = load_catalog(profile="demo")["b7_sharegpt"].model_copy(
        update={"token_budget": 0, "cost_budget_usd": 0.0, "target": target}
    )
    spec = spec.model_copy(update={
        "generation": spec.generation.model_copy(update={"max_tokens": MAX_TOKENS}),
        "breaker": spec.breaker.model_copy(update={"empty_retries": 0}),  # greedy: asking again gets the same
    })  # fmt: skip
    prompts, estimate = build_dataset_assets(spec)[:2]
    config = {"ops": {f"{spec.name}_estimate": {"config": {"canary_prompts": SAMPLE}}}}
    engine = EngineResource(kind="openai", model=str(model), api_key_env="")
    with dg.DagsterInstance.ephemeral() as instance:
        return dg.materialize(
            [prompts, estimate], instance=instance, run_config=config, raise_on_error=False,
            tags={"dagster/asset_partition_range_start": spec.partition_keys[0],
                  "dagster/asset_partition_range_end": spec.partition_keys[-1]},
            resources={**shard_resources(StorageResource(root=str(root))), "engine": engine},
        )  # fmt: skip


def _canary(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == CANARY]
    return evaluation


def _ask(base_url: str, model: Path, text: str) -> dict[str, Any]:
    """One chat request straight to the server, as the engine sends it (thinking off)."""
    body = {"model": str(model), "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS,
            "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    # The server loads a model at its first request and answers one request at a time: on a machine at load 16
    # a first request's answer took over 60 s. The bound is for a server that never answers.
    with urllib.request.urlopen(request, timeout=600) as resp:
        return json.loads(resp.read())


def _text_tokens(model: Path, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model)(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("name", ["lossy", "healthy"])
def test_the_canary_names_lost_text_exactly_when_transformers_serve_loses_it(
    servers: dict[str, tuple[str, Path]], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, model = servers[name]
    answer = _ask(base_url, model, "Write a haiku about speculative decoding.")  # the server's own account
    reported, content = answer["usage"]["completion_tokens"], answer["choices"][0]["message"]["content"] or ""
    lost = _text_tokens(model, content) < 0.9 * reported - 1  # its end-of-turn token is counted, not written
    assert lost is (name == "lossy"), answer
    canary = _canary(_estimate(base_url, model, tmp_path, monkeypatch))
    description = canary.description or ""
    assert "\n" not in description
    if name == "lossy":
        assert not canary.passed and "lost_text" in canary.metadata["failing"].value + description
        assert "lost_text (e.g. " in description, description  # the cause named, with the prompts it hit
    else:
        assert "lost_text" not in description and canary.metadata.get("canary_share_lost_text") is None


@pytest.fixture(scope="module")
def smollm2_url(serve_url: str, smollm2: Path) -> str:
    """The server with SmolLM2-135M-Instruct loaded by one request (a real instruct model whose template adds a
    system turn): it lists the models it has loaded, and the engine refuses a server that lists others only."""
    _ask(serve_url, smollm2, "Hello.")
    return serve_url


def test_transformers_serve_counts_each_prompt_as_the_target_derived_from_its_checkpoint_renders_it(
    smollm2_url: str, smollm2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = _canary(_estimate(smollm2_url, smollm2, tmp_path, monkeypatch))
    assert "prompt_count_mismatch" not in (canary.description or "")
    assert canary.metadata.get("canary_share_prompt_count_mismatch") is None


def test_another_vocabularys_profile_on_transformers_serve_fails_the_canary_in_one_line(
    smollm2_url: str, smollm2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen ids for a SmolLM2 target: every structure flag would pass (the text round-trips); only the server's own
    prompt counts tell, and the canary names them before the run pays for the rest."""
    canary = _canary(_estimate(smollm2_url, smollm2, tmp_path, monkeypatch, target="qwen3-test"))
    description = canary.description or ""
    assert not canary.passed and "\n" not in description
    assert "prompt_count_mismatch" in description and "target qwen3-test renders" in description, description
