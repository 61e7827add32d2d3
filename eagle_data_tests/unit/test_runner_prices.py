"""A dollar budget is a budget only with a price: refused before the first request on a server whose replies
report no cost, and the estimate's dollars come from a price given or from what the sampled replies cost."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from eagle_data import layout
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings
from eagle_data.runner.estimate import estimate_generation
from eagle_data.runner.prices import PRICE_ENV, PriceUnknown
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.types import UserError
from eagle_data_tests import fixtures_stages as stage


def test_a_dollar_budget_on_a_server_that_reports_no_cost_is_refused_before_the_first_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#34.3: a $1 budget against a server reporting no cost (vLLM, plain OpenAI-compatible) sent every prompt."""
    monkeypatch.delenv(PRICE_ENV, raising=False)
    server = FakeOpenAI(Faults(cost_per_token=0.0))
    server.start()
    spec, store, shards = spec_for_tests(cost_budget_usd=1.0), ShardStore(str(tmp_path)), prompt_shards(1, 20)
    for key, frame in shards.items():
        store.write_shard(spec.name, layout.prompts_asset(spec.name), key, frame)
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="qwen3-8b")
    try:
        with pytest.raises(UserError) as refused:
            stage.generate(spec, store, list(shards), engine, log=lambda _: None,
                              settings=RunnerSettings(progress_bar=False))  # fmt: skip
    finally:
        server.stop()
    assert server.received == 0
    message = str(refused.value)
    assert isinstance(refused.value, PriceUnknown) and "\n" not in message
    assert message.startswith("b7_sharegpt: no price for qwen3-8b:") and PRICE_ENV in message
    assert message.endswith("or drop cost_budget_usd (0) in the catalog entry")


def _sample(cost_usd: float) -> pl.DataFrame:
    return pl.DataFrame({
        "status": ["ok", "ok"], "prompt_tokens": [50, 50], "completion_tokens": [100, 100],
        "cost_usd": [cost_usd, cost_usd], "messages": [[{"role": "user"}, {"role": "assistant"}]] * 2,
    })  # fmt: skip


def test_the_estimate_prices_its_sample_by_the_reported_cost_or_says_it_cannot_know(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#34.3: with no price in the run config the estimate printed ~$0.00, so `within_budget` passed."""
    monkeypatch.delenv(PRICE_ENV, raising=False)
    spec = spec_for_tests(cost_budget_usd=1.0)
    prompts = pl.DataFrame({"messages": [[{"role": "user", "content": "x" * 46}]] * 1000})  # 50 tokens each

    def count(texts: list[str]) -> list[int]:
        return [len(t) for t in texts]

    reported = estimate_generation([prompts], spec, count, _sample(cost_usd=0.0015), 0.0, 0.0)
    assert reported.usd == pytest.approx(1000 * 0.0015)  # the sample's dollars per token, over 1,000 replies
    assert reported.over_budget().startswith("b7_sharegpt: projected $1.50 exceeds cost_budget_usd $1.00")

    unknown = estimate_generation([prompts], spec, count, _sample(cost_usd=0.0), 0.0, 0.0)
    assert unknown.usd is None and "~$" not in unknown.line() and "est_cost_usd" not in unknown.figures()
    assert "cannot be checked" in unknown.over_budget() and PRICE_ENV in unknown.over_budget()

    monkeypatch.setenv(PRICE_ENV, "2,10")  # USD per million prompt and completion tokens
    priced = estimate_generation([prompts], spec, count, _sample(cost_usd=0.0), 0.0, 0.0)
    assert priced.usd == pytest.approx(1000 * (50 * 2e-6 + 100 * 10e-6))
