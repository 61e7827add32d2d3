"""Stand-ins: real servers on 127.0.0.1 (an OpenAI-compatible API, SGLang, a Slack webhook, a TCP proxy that can
be cut) that the tests and the benchmarks talk to. They live here, not in the test package, so a benchmark
needs nothing of the tests; no other room of eagle_data imports them (test_import_floors)."""
