"""The parts of a generation call, each alone: the dispatcher against a real server, the shard writer on a
real store, the reporter's line."""

from __future__ import annotations

import asyncio
from pathlib import Path

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings
from eagle_data.runner.admission import Admission, prompt_bytes
from eagle_data.runner.dispatch import Dispatcher
from eagle_data.runner.progress import Tally
from eagle_data.runner.reporter import Reporter
from eagle_data.runner.resultlog import resume_key, turn_record
from eagle_data.runner.writer import OpenShard, ShardWriter
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.types import Completion, Message

SETTINGS = RunnerSettings(backoff_base_s=0.0, backoff_cap_s=0.0, progress_bar=False, progress_every=1)
ASKED: list[Message] = [{"role": "user", "content": "a question"}]


def test_the_dispatcher_alone_asks_a_billed_empty_reply_again_once_and_counts_it_wasted(server: FakeOpenAI) -> None:
    server.faults = Faults(shape="null_content")
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
    tally, lines = Tally(total=1), []
    dispatch = Dispatcher(engine, spec_for_tests(), SETTINGS, 64, Tally(total=1), lines.append)

    async def one() -> tuple[Completion | None, int, str]:
        admitted, held = await dispatch.admission.admit(ASKED)
        assert admitted
        try:
            return await dispatch.complete(tally, ASKED, "p0", held)
        finally:
            dispatch.admission.leave(None)
            await engine.aclose()

    done, attempts, error = asyncio.run(one())
    assert done is None and attempts == 2 == server.received and error.startswith("empty_reply: no content")
    assert (tally.requests, tally.wasted, tally.errors["empty_reply"]) == (2, 2, 2)
    assert dispatch.admission.limiter.in_flight == 0 and dispatch.usable == 0


def test_the_shard_writer_alone_makes_turns_durable_within_flush_every_s_then_frees_the_lease(tmp_path: Path) -> None:
    spec, store = spec_for_tests(), ShardStore(str(tmp_path))
    writer = ShardWriter(store, spec, "run-a", RunnerSettings(flush_every_s=0.05), True, print, print)
    turn = turn_record("p0", 0, resume_key({"model": "m"}, spec), Completion("an answer"), 1, 0.1)

    async def write() -> list:
        assert writer.take("00000") is None  # the lease is ours
        shard = OpenShard("00000", writer.log("00000"), ["p0"], {})
        writer.opened(shard)
        flushing = asyncio.create_task(writer.flush_loop())
        writer.add(shard, turn)
        await asyncio.sleep(0.5)
        flushing.cancel()
        return writer.log("00000").load_turns()  # read back as another reader would

    assert [t["prompt_id"] for t in asyncio.run(write())] == ["p0"]
    other = ShardWriter(store, spec, "run-b", RunnerSettings(), True, print, print)
    assert other.take("00000") is not None  # held by run-a while it lives
    writer.abandon()
    assert other.take("00000") is None


def test_the_reporter_alone_adds_the_breakers_pulse_to_the_progress_line() -> None:
    engine = make_engine("openai", base_url="http://127.0.0.1:9/v1", model="m")  # never contacted
    total, lines = Tally(total=4), []
    dispatch = Dispatcher(engine, spec_for_tests(), SETTINGS, 64, total, lines.append)
    reporter = Reporter("b7_sharegpt", SETTINGS, total, dispatch, engine, lines.append)
    assert " | " not in reporter.line()  # nothing judged yet: no pulse
    dispatch.admission.breaker.judge("p0", Completion("", completion_tokens=20))
    dispatch.admission.breaker.judge("p1", Completion("word " * 30, completion_tokens=40, finish_reason="length"))
    reporter.finished_one("ok")
    assert lines == [reporter.line()] and lines[0].endswith(" | window 2: 50.0% rejected, 50.0% truncated")


def test_admission_alone_holds_each_requests_worst_case_and_stops_for_budget_when_one_more_cannot_fit() -> None:
    lines: list[str] = []
    admission = Admission(spec_for_tests(token_budget=150), SETTINGS, 64, lines.append)
    worst = prompt_bytes(ASKED) + 64

    async def two() -> tuple[tuple[bool, object], tuple[bool, object]]:
        first = await admission.admit(ASKED)
        admission.answered("p0", Completion("an answer " * 5, prompt_tokens=10, completion_tokens=100))
        admission.leave(first[1])
        return first, await admission.admit(ASKED)  # 110 spent: another worst case of 82 crosses 150

    first, second = asyncio.run(two())
    assert first == (True, (worst, None)) and second == (False, None)
    reason = admission.stop_reason
    assert admission.stop_status == "skipped_budget" and "token budget reached (110 of 150 tokens" in reason
    assert admission.limiter.in_flight == 0 and admission.budget.in_flight == 0
    assert lines == [
        f"{reason}: stopped sending; letting 1 in-flight requests land, the rest are marked skipped_budget"
    ]
