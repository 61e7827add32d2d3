"""Sampling mixtures: each prompt gets one weighted setting by a seeded hash of its id (the same on a
re-run), the request carries it, the row names it, and the realized mix is reported against the weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_data import layout
from eagle_data.catalog import Generation, SamplingSetting
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, mixture
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data_tests import fixtures_stages as stage

MIX = (
    SamplingSetting(name="cold", weight=0.5, temperature=0.2),
    SamplingSetting(name="warm", weight=0.3, temperature=0.9, top_p=0.8, min_p=0.05),
    SamplingSetting(name="think_low", weight=0.2, reasoning_effort="low", thinking=True),
)


def test_ten_thousand_prompts_fall_within_one_percent_of_the_weights() -> None:
    ids = [f"b7_sharegpt-{i:06d}" for i in range(10_000)]
    names = [mixture.assign(pid, MIX, seed=0).name for pid in ids]  # type: ignore[union-attr]
    figures = mixture.realized(names, MIX)
    for s in MIX:
        assert figures[f"mix_{s.name}_configured"] == pytest.approx(s.weight)
        assert abs(figures[f"mix_{s.name}_realized"] - s.weight) <= 0.01, s.name
    again = [mixture.assign(pid, MIX, seed=0).name for pid in ids]  # type: ignore[union-attr]
    assert again == names  # a re-run assigns the same
    other = [mixture.assign(pid, MIX, seed=1).name for pid in ids]  # type: ignore[union-attr]
    assert 0.3 < sum(a != b for a, b in zip(names, other, strict=True)) / len(ids) < 0.9  # the seed matters


def test_mixture_names_must_be_distinct() -> None:
    with pytest.raises(ValueError, match="distinct"):
        Generation(mixture=(MIX[0], MIX[0]))


def test_each_request_carries_its_prompts_setting_and_a_rerun_reuses_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLE_TEST_KEY", "test-key")
    server = FakeOpenAI(Faults(reply_tokens=(20, 40)))
    server.start()
    try:
        spec = spec_for_tests()
        spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"mixture": MIX})})
        store, shards = ShardStore(str(tmp_path)), prompt_shards(2, 100)
        for key, frame in shards.items():
            store.write_shard(spec.name, layout.prompts_asset(spec.name), key, frame)
        engine = make_engine("openrouter", base_url=f"http://127.0.0.1:{server.port}/api/v1", model="m",
                             temperature=0.7, top_p=0.95, api_key_env="EAGLE_TEST_KEY")  # fmt: skip
        settings = RunnerSettings(progress_bar=False)
        figures, _ = stage.generate(spec, store, list(shards), engine, log=lambda _: None, settings=settings)
        sent_before = dict(server.requests)
        stage.generate(spec, store, list(shards), engine, log=lambda _: None, settings=settings)
    finally:
        server.stop()
    assert dict(server.requests) == sent_before  # the re-run paid for nothing: same config, same settings
    rows = [store.read_shard(spec.name, spec.name, key) for key in shards]
    by_name = {s.name: s for s in MIX}
    for frame in rows:
        for pid, name in frame.select("prompt_id", "sampling_setting").iter_rows():
            setting = mixture.assign(pid, MIX, 0)
            assert setting is not None and name == setting.name
            sent = server.settings[f"{pid}#1"]
            expected = by_name[name]
            assert sent["temperature"] == (expected.temperature if expected.temperature is not None else 0.7)
            assert sent["top_p"] == (expected.top_p if expected.top_p is not None else 0.95)
            assert sent.get("min_p") == expected.min_p
            if name == "think_low":  # OpenRouter's reasoning object
                assert sent["reasoning"] == {"enabled": True, "effort": "low"}
    total = sum(f.height for f in rows)
    for s in MIX:
        share = sum((f["sampling_setting"] == s.name).sum() for f in rows) / total
        assert figures[f"mix_{s.name}_realized"] == pytest.approx(share, abs=1e-4)
        assert figures[f"mix_{s.name}_configured"] == pytest.approx(s.weight)
