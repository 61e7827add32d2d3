"""Provenance on every row: generation, validated and exported rows all say which settings, server,
tokenizer and chat template made them (a real OpenAI-compatible server on 127.0.0.1)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from eagle_data import layout, provenance
from eagle_data.engines import make_engine
from eagle_data.exports import Admission
from eagle_data.runner import RunnerSettings
from eagle_data.stages.export import export
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.targets import load_target
from eagle_data_tests import fixtures_stages as stage


def test_every_row_of_every_stage_carries_its_provenance(tmp_path: Path) -> None:
    server = FakeOpenAI(Faults(reply_tokens=(30, 60)))
    server.start()
    try:
        spec = spec_for_tests(target="qwen3-test")
        store, shards = ShardStore(str(tmp_path)), prompt_shards(2, 20, turns=2)
        for key, frame in shards.items():
            store.write_shard(spec.name, layout.prompts_asset(spec.name), key, frame)
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="qwen/qwen3-8b",
                             max_tokens=200, temperature=0.6)  # fmt: skip
        stage.generate(spec, store, list(shards), engine, log=lambda _: None,
                          settings=RunnerSettings(progress_bar=False))  # fmt: skip
        stage.validate(spec, store, list(shards))
        export([spec], store, {spec.name: Admission(tuple(shards))}, seed=0, log=lambda _: None)
    finally:
        server.stop()
    generations = pl.concat([store.read_shard(spec.name, spec.name, k) for k in shards])
    validated = pl.concat([store.read_shard(spec.name, layout.validated_asset(spec.name), k) for k in shards])
    exported = store.read_frame(layout.export_file(spec.name, layout.TRAIN_FILE))
    mixed = store.read_frame(layout.mix())
    assert generations.height == validated.height == 40 and exported.height > 30 and mixed.height == exported.height
    for frame, columns in [(generations, provenance.GENERATION), (validated, provenance.COLUMNS),
                           (exported, provenance.COLUMNS), (mixed, provenance.COLUMNS)]:  # fmt: skip
        for column in columns:
            assert frame[column].null_count() == 0 and (frame[column] != "").all(), column  # 100% of rows
    sent = json.loads(generations["sampling"][0])
    assert (sent["model"], sent["temperature"], sent["max_tokens"], sent["engine"]) == (
        "qwen/qwen3-8b",
        0.6,
        200,
        "openai",
    )
    assert set(generations["served_model"]) == {"qwen/qwen3-8b"}  # what the server answered with
    assert set(generations["provider"]) == {"FakeProvider"}
    target = load_target("qwen3-test")
    assert set(exported["tokenizer_hash"]) == {target.tokenizer_hash}
    assert set(exported["chat_template_hash"]) == {target.chat_template_hash}
    assert set(exported["config_hash"]) == set(generations["config_hash"])
