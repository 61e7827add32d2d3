"""How much of a rate-limit burst the adaptive in-flight limit avoids: the share of requests a provider
rejects with 429 when the client ramps up (the default) against one that starts at full width, the same
burst in the same run.

The burst: the provider takes at most 48 requests at once over its first 2,000 and answers 429 with
`Retry-After: 0.5` past that; the client may hold 2,000 in flight. Each side runs 3 shards of 2,000
prompts through the whole `run_generation` call. The share depends on how fast the client's machine is,
so it is a figure measured here, not a test assertion (the tests check that nothing is lost or paid twice).

    python benchmarks/bench_ratelimit.py [--prompts 2000] [--shards 3]
Last lines: `ramped: X% of N rejected`, `full width: …`, `RESULT ratelimit_rejected_ramped_vs_full <ratio>`
(the ramped share over the full-width share; lower is better, target <= 0.2 with ramped <= 5%).
"""

from __future__ import annotations

import argparse
import tempfile

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore

BURST = Faults(latency_s=0.02, latency_jitter_s=0.02, rate_limit_first=2000, rate_limit_cap=48, retry_after="0.5")
FAST_RETRY = {"backoff_base_s": 0.01, "backoff_cap_s": 0.1, "progress_bar": False}


def rejected_share(initial_in_flight: int | None, prompts: int, shards: int) -> tuple[float, int]:
    """One run against a fresh burst: (share of requests answered 429, requests received)."""
    server = FakeOpenAI(BURST)
    server.start()
    try:
        width = {"initial_in_flight": initial_in_flight} if initial_in_flight else {}
        settings = RunnerSettings(max_in_flight=2000, **width, **FAST_RETRY)
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", timeout_s=30.0)
        with tempfile.TemporaryDirectory() as root:
            run_generation(engine, spec_for_tests(), prompt_shards(shards, prompts), ShardStore(root),
                           settings=settings, log=lambda _: None)  # fmt: skip
        return server.outcomes["429"] / server.received, server.received
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2000, help="prompts per shard")
    parser.add_argument("--shards", type=int, default=3)
    args = parser.parse_args()
    ramped, n_ramped = rejected_share(None, args.prompts, args.shards)
    full, n_full = rejected_share(2000, args.prompts, args.shards)
    print(f"ramped: {ramped:.1%} of {n_ramped} requests rejected")
    print(f"full width: {full:.1%} of {n_full} requests rejected")
    print(f"RESULT ratelimit_rejected_ramped_vs_full {ramped / full:.3f}")


if __name__ == "__main__":
    main()
