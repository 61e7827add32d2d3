"""The generation stage as the assets call it: figures merged across shards, the truncation warning."""

from pathlib import Path

from eagle_data import pipeline
from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings
from eagle_data.storage import ShardStore
from eagle_data_tests.servers.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests


def test_generate_sums_shard_counts_and_warns_when_replies_hit_max_tokens(tmp_path: Path):
    server = FakeOpenAI(Faults(reply_tokens=(20, 60)))
    server.start()
    try:
        spec = spec_for_tests()
        spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"max_tokens": 40})})
        store, shards = ShardStore(str(tmp_path)), prompt_shards(2, 50)
        for key, frame in shards.items():
            store.write_shard(spec.name, pipeline.prompts_asset(spec), key, frame)
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=40)
        lines: list[str] = []
        figures, per_partition = pipeline.generate(
            spec, store, list(shards), engine, log=lines.append, settings=RunnerSettings(progress_bar=False)
        )
    finally:
        server.stop()
    assert figures["total"] == 100 and [f["total"] for f in per_partition.values()] == [50, 50]
    assert figures["truncated"] == server.outcomes["truncated"] > 5  # ~half the natural lengths exceed 40
    assert figures["suggested_max_tokens"] >= 60 and "set max_tokens to about" in figures["truncation_warning"]
    assert any(line.startswith("WARNING b7_sharegpt: truncation") for line in lines)
