"""The quality gates on real text: SmolLM2-135M-Instruct's own replies (eagle_data_tests/fixtures/
smollm2_replies.json, written by make_smollm2_replies.py beside it), a real runner against a server that goes
empty mid-run, and the real `{ds}_validated` asset judging two shards one after the other.

Each test here failed on the code before the gates judged shares by a confidence bound, counted each row under
one verdict, set looping replies aside, compared length_shift shard by shard and counted empty replies recorded
failed (see docs/quality.md)."""

from __future__ import annotations

import codecs
import contextlib
import inspect
import io
import json
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from eagle_data.catalog import Adapter, Checks, DatasetSpec
from eagle_data.catalog import Breaker as BreakerSettings
from eagle_data.defs.assets import build_dataset_assets
from eagle_data.defs.checks import build_checks
from eagle_data.defs.io_managers import shard_resources
from eagle_data.defs.resources import EngineResource, StorageResource
from eagle_data.engines import make_engine
from eagle_data.quality import Inputs, row_verdicts, run_checks
from eagle_data.quality.canary import judge
from eagle_data.quality.reply import reply_verdict
from eagle_data.quality.truncation import ReplyLengths, truncation_report
from eagle_data.quality.verdicts import is_loop, loop_share
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.runner.breaker import Breaker
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore
from eagle_data.targets.rows import MESSAGE_DTYPE
from eagle_data.types import Completion
from eagle_data_tests.fixtures_quality import generation_frame
from eagle_data_tests.fixtures_stages import validate

FIXTURE = Path(__file__).parents[1] / "fixtures" / "smollm2_replies.json"
DEFAULTS = Checks()


@cache
def replies() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def smollm2_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Validated-shaped rows of real replies: SmolLM2's own token counts (its end-of-turn token included, as the
    loss mask trains it), structure verified, thinking off as SmolLM2 has none."""
    out = []
    for i, r in enumerate(rows):
        cut = r["finish_reason"] == "length"
        out.append({
            "prompt_id": f"{r.get('id', 'x')}-{r.get('turn', 1)}-{i}", "status": "truncated" if cut else "ok",
            "finish_reason": r["finish_reason"], "content": r["content"], "reasoning": "",
            "completion_tokens": r["completion_tokens"], "loss_tokens": r["completion_tokens"],
            "roundtrip_ok": True, "prefix_ok": True, "structure_ok": True, "special_in_text": r.get("special", 0),
            "eot_ok": not cut, "ids_match": None, "target_error": "", "reply_tokens": r["completion_tokens"],
            "reply_turns": 1,
        })  # fmt: skip
    return pl.DataFrame(out, schema_overrides={"ids_match": pl.Boolean, "reply_tokens": pl.Int32,
                                               "reply_turns": pl.Int32})  # fmt: skip


def results(frame: pl.DataFrame, checks: Checks = DEFAULTS) -> dict[str, Any]:
    return {r.name: r for r in run_checks(frame, Inputs(checks, thinking=False))}


def demo(key: str = "demo_greedy", turn: int = 1) -> list[dict[str, Any]]:
    return [r for r in replies()[key] if r["turn"] == turn]


def reply(key: str, prompt_id: str, turn: int = 1) -> dict[str, Any]:
    return next(r for r in replies()[key] if r["id"] == prompt_id and r["turn"] == turn)


# ---- shares judged with a confidence bound, each row counted once ------------------------------------------
def test_one_short_real_reply_set_aside_for_its_prompt_does_not_block_a_10_row_shard() -> None:
    """sg_0014 asks what `<|im_end|>` means (set aside: special_token_in_text) and SmolLM2 answers "In ChatML, `"
    (6 tokens): one short reply already set aside used to fail empty_response, 10% over a 1% gate."""
    asked = {**reply("demo_greedy", "sg_0014"), "special": 1}
    others = [r for r in demo() if r["id"] != "sg_0014" and r["completion_tokens"] > 16][:9]
    shard = smollm2_frame([asked, *others])
    assert row_verdicts(shard, DEFAULTS, False)["verdict"][0] == "special_token_in_text"
    gates = results(shard)
    assert gates["empty_response"].passed, gates["empty_response"].message


def test_one_short_real_reply_in_10_is_not_sure_while_2_percent_of_10000_is() -> None:
    """One 6-token reply in a 10-row shard (10%, over the 1% gate) says nothing sure at 99.9%; 2% of 10,000 rows
    (the same real replies, repeated under other prompt ids) does."""
    short = reply("demo_greedy", "sg_0014")
    long = [r for r in demo() if r["completion_tokens"] > 16]
    small = results(smollm2_frame([short, *long[:9]]))["empty_response"]
    assert small.passed and "10.0% of 10 replies were empty or had loss-mask sum <= 16" in small.message
    big = [short] * 200 + [long[i % len(long)] for i in range(9800)]
    gate = results(smollm2_frame(big))["empty_response"]
    assert not gate.passed and gate.message.startswith("2.0% of 10000 replies were empty or had loss-mask sum <= 16")


# ---- the demo sample at the default thresholds --------------------------------------------------------------
DEMO_SHARDS = [[f"sg_{i:04d}" for i in range(start, min(start + 10, 36))] for start in range(0, 36, 10)]


def demo_shards(key: str) -> list[pl.DataFrame]:
    """The demo's 4 shards (10, 10, 10 and 6 prompts, as its prompts step makes them) of SmolLM2's replies, each row
    a conversation whose first two user turns were regenerated: the last reply's text, the turns' tokens summed;
    sg_0014's prompt holds `<|im_end|>` as text (special_token_in_text, as the targets room flags it)."""
    turns: dict[str, list[dict[str, Any]]] = {}
    for r in replies()[key]:
        turns.setdefault(r["id"], []).append(r)
    rows = {}
    for prompt_id, said in turns.items():
        tokens = sum(r["completion_tokens"] for r in said)
        rows[prompt_id] = {**said[-1], "id": prompt_id, "completion_tokens": tokens, "special": prompt_id == "sg_0014"}
    return [smollm2_frame([rows[p] for p in shard]) for shard in DEMO_SHARDS]


def test_smollm2_demo_replies_sampled_as_the_demo_does_pass_every_blocking_gate_at_the_defaults() -> None:
    """Sampled at the demo's temperature 0.8, max_tokens 256: every shard passes every blocking gate; greedy, shard
    00001 fails `loops` (sg_0011, sg_0013, sg_0015 and sg_0017 loop: 4 of 10, surely over 5%)."""
    for frame in demo_shards("demo_sampled"):
        assert [r.name for r in results(frame).values() if r.blocking and not r.passed] == []
    greedy = [[r.name for r in results(frame).values() if r.blocking and not r.passed]
              for frame in demo_shards("demo_greedy")]  # fmt: skip
    assert greedy == [[], ["loops"], [], []]


# ---- loops: caught in real replies, one verdict for validation, the breaker and the canary ------------------
# SmolLM2's replies that loop, (set, prompt id, turn): greedy decoding repeating a sentence or a paragraph to the
# cap ("The box is like a transformer, and the room is like a computer's processing unit." over and over), a
# list whose items 2 to 5 are one paragraph, code ending "time.sleep.time.sleep...", and sampled replies
# ending "Risk-Risk-Risk-...".
LOOPS = [
    ("demo_greedy", "sg_0008", 2), ("demo_greedy", "sg_0017", 2), ("demo_greedy", "sg_0023", 2),
    ("demo_greedy", "sg_0013", 1), ("demo_greedy", "sg_0011", 2), ("demo_greedy", "sg_0005", 1),
    ("demo_greedy", "sg_0017", 1), ("demo_sampled", "sg_0017", 1), ("demo_sampled", "sg_0017", 2),
]  # fmt: skip


@pytest.mark.parametrize(("key", "prompt_id", "turn"), LOOPS)
def test_a_real_loop_is_set_aside_by_the_row_verdict_and_the_breaker(key: str, prompt_id: str, turn: int) -> None:
    looped = reply(key, prompt_id, turn)
    verdict = row_verdicts(smollm2_frame([looped]), DEFAULTS, False)["verdict"][0]
    done = Completion(content=looped["content"], completion_tokens=looped["completion_tokens"],
                      finish_reason=looped["finish_reason"])  # fmt: skip
    assert (verdict, reply_verdict(done, DEFAULTS)) == ("loop", "loop")


def test_a_shard_of_looping_real_replies_fails_the_loops_gate_and_the_canary_names_them() -> None:
    looped = [reply(*k) for k in LOOPS]
    healthy = [r for r in demo("demo_sampled") if r["id"] != "sg_0017"][:16]
    shard = smollm2_frame(healthy + looped)  # 9 of 25 loop
    gate = results(shard)["loops"]
    assert (gate.passed, gate.blocking) == (False, True)
    assert gate.message.startswith("36.0% of 25 answered replies loop")
    rows = row_verdicts(shard, DEFAULTS, False)
    sample = judge(rows, DEFAULTS, False, dataset="b7", max_tokens=256, suggested_max_tokens=256, config_hash="h")
    assert "loops" in sample.failing and "36.0% of them are loop" in sample.line


def test_the_breaker_stops_a_model_that_loops_on_real_replies() -> None:
    looped = [reply(*k) for k in LOOPS]
    healthy = [r for r in demo("demo_sampled") if r["id"] != "sg_0017"]
    breaker = Breaker(spec_for_tests())
    for i in range(200):  # one reply in three loops
        r = looped[i % len(looped)] if i % 3 == 0 else healthy[i % len(healthy)]
        breaker.judge(f"p{i}", Completion(content=r["content"], completion_tokens=r["completion_tokens"],
                                          finish_reason=r["finish_reason"]))  # fmt: skip
        if breaker.tripped:
            break
    assert "were loop (checks.max_loop_share 0.05)" in breaker.tripped and i < 200


# Real text that repeats itself without looping. Jane Taylor's "The Star" (1806, public domain) and the traditional
# "Old MacDonald Had a Farm" as sung: refrains after every stanza.
TWINKLE = """Twinkle, twinkle, little star,
How I wonder what you are!
Up above the world so high,
Like a diamond in the sky.
Twinkle, twinkle, little star,
How I wonder what you are!

When the blazing sun is gone,
When he nothing shines upon,
Then you show your little light,
Twinkle, twinkle, all the night.
Twinkle, twinkle, little star,
How I wonder what you are!

Then the traveller in the dark
Thanks you for your tiny spark;
He could not see which way to go,
If you did not twinkle so.
Twinkle, twinkle, little star,
How I wonder what you are!

In the dark blue sky you keep,
And often through my curtains peep,
For you never shut your eye,
Till the sun is in the sky.
Twinkle, twinkle, little star,
How I wonder what you are!

As your bright and tiny spark
Lights the traveller in the dark,
Though I know not what you are,
Twinkle, twinkle, little star.
Twinkle, twinkle, little star,
How I wonder what you are!"""
MACDONALD = "\n\n".join(
    f"Old MacDonald had a farm, E-I-E-I-O,\nAnd on that farm he had a {animal}, E-I-E-I-O,\n"
    f"With a {say} {say} here and a {say} {say} there,\nHere a {say}, there a {say}, everywhere a {say} {say},\n"
    "Old MacDonald had a farm, E-I-E-I-O."
    for animal, say in (("cow", "moo"), ("pig", "oink"), ("duck", "quack"), ("horse", "neigh"))
)
# SmolLM2's own lists and code that do not loop (greedy, the `extra` set): the months, ten countries, a
# multiplication table, a C program, unit tests, an HTML table of products, a SQL schema.
NOT_LOOPS = (
    "List the months of the year with the number of days in each.", "List 10 countries in Europe and their capitals.",
    "Write a Python function that prints a multiplication table from 1 to 10.",
    "Write a C program that prints the first 20 prime numbers.",
    "Write unit tests in Python for a function that adds two numbers.",
    "Write an HTML page with a table of five products and their prices.",
    "Write a SQL script that creates tables for students, courses and enrollments.",
)  # fmt: skip


def human_texts() -> dict[str, str]:
    """Real human-written text: refrains, a list of aphorisms, code, a markdown table."""
    with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the Zen
        import this
    return {
        "The Star": TWINKLE,
        "Old MacDonald": MACDONALD,
        "the Zen of Python": codecs.decode(this.s, "rot13"),
        "textwrap's source": inspect.getsource(textwrap),
        "the check table": "\n".join(line for line in check_section().splitlines() if line.startswith("|")),
    }


def check_section() -> str:
    """docs/quality.md's registry section, whose table lists every check: rows that differ in one cell or two."""
    return (Path(__file__).parents[2] / "docs" / "quality.md").read_text().split("## One registry")[1].split("\n## ")[0]


@pytest.mark.parametrize("name", ["The Star", "Old MacDonald", "the Zen of Python", "textwrap's source",
                                  "the check table"])  # fmt: skip
def test_human_refrains_lists_code_and_tables_are_no_loops(name: str) -> None:
    assert not is_loop(human_texts()[name]), f"{name}: loop_share {loop_share(human_texts()[name]):.2f}"


@pytest.mark.parametrize("prompt", NOT_LOOPS)
def test_smollm2_lists_and_code_that_do_not_loop_are_kept(prompt: str) -> None:
    said = next(r for r in replies()["extra"] if r["prompt"] == prompt)
    assert row_verdicts(smollm2_frame([said]), DEFAULTS, False)["verdict"][0] in ("pass", "truncated")


@pytest.mark.parametrize(
    ("prompt", "refrain"),
    [("Write a short poem about the sea with a refrain that repeats after every stanza.",
      "Refreshing, tore through the night,\nThe sea, a vessel, a soul,\nA reflection of our souls,"),
     ("Write the lyrics of a marching song with a refrain.",
      "She leaped into the sea of all things.\nA message written on the back of a lion."),
     ("Write a song about friendship with a chorus. Label the verses and the chorus.", "of unkind laughter")],
)  # fmt: skip
def test_smollm2_poems_with_a_refrain_are_kept(prompt: str, refrain: str) -> None:
    """Sampled as the demo does, SmolLM2 writes real refrains: the same lines after every stanza, new lines between."""
    said = next(r for r in replies()["extra_sampled"] if r["prompt"] == prompt)
    assert said["content"].count(refrain) >= 3
    assert row_verdicts(smollm2_frame([said]), DEFAULTS, False)["verdict"][0] in ("pass", "truncated")


@pytest.mark.parametrize(
    "prompt",
    ["Write a short poem about the sea with a refrain that repeats after every stanza.",
     "Write a song about friendship with a chorus. Label the verses and the chorus.",
     "Write a grocery list for a week of healthy meals.",
     "Write a YAML configuration for a web server with three routes.",
     "Give me a numbered list of 12 tips for studying effectively.", "用三句话解释什么是机器学习。"],
)  # fmt: skip
def test_smollm2_poems_lists_and_code_that_do_loop_are_caught(prompt: str) -> None:
    """Asked for a refrain, greedy SmolLM2 writes "A refrain of the sea, a refrain of the sea," to the cap; asked for
    12 tips, it counts "13. Use a Pomodoro Technique for focused studying" on to the cap; asked in Chinese, it
    repeats one sentence between commas."""
    said = next(r for r in replies()["extra"] if r["prompt"] == prompt)
    assert is_loop(said["content"]), loop_share(said["content"])


def test_a_sampled_poem_that_repeats_two_lines_to_the_cap_is_caught() -> None:
    autumn = "Write a poem about autumn in which every stanza ends with the same line."
    said = next(r for r in replies()["extra_sampled"] if r["prompt"] == autumn)["content"]
    assert said.count("A swirl of leaves, a dole of daisies,\nA twilight's ever-changing hue,") >= 8 and is_loop(said)


# ---- the canary's suggested max_tokens --------------------------------------------------------------------
def test_the_suggested_max_tokens_follows_real_reply_lengths_and_never_exceeds_a_cap_that_covered_them() -> None:
    """SmolLM2's replies that ended under 96 tokens, as a canary under max_tokens 96 with none cut: the suggestion
    is their 95th percentile with headroom, at most 96 (it was 256 whatever the replies)."""
    ended = [r for key in ("demo_greedy", "demo_sampled") for r in replies()[key] if r["completion_tokens"] < 96]
    lengths = ReplyLengths.of([r["completion_tokens"] for r in ended], [r["finish_reason"] for r in ended])
    cut = truncation_report(lengths, max_new_tokens=96, threshold=DEFAULTS.max_truncated_share)
    assert cut.rate == 0.0 and cut.p95_tokens < 96
    assert cut.p95_tokens <= cut.suggested_max_tokens <= 96
    cut_at_256 = truncation_report(lengths, max_new_tokens=256, threshold=DEFAULTS.max_truncated_share)
    assert cut_at_256.suggested_max_tokens <= 1.4 * cut.p95_tokens  # not a round 256 the data never asked for


# ---- a server that goes empty mid-run --------------------------------------------------------------------
def test_a_server_that_goes_empty_mid_run_fails_empty_response_beside_failed_rate(tmp_path: Path) -> None:
    """4 healthy answers, then every reply empty: 6 of 10 rows are recorded failed after their retry. failed_rate
    fails, and so does empty_response, which names the empty replies as the cause."""
    spec = spec_for_tests(breaker=BreakerSettings(enabled=False))
    server = FakeOpenAI(Faults(healthy_first=4, p_empty=1.0, reply_tokens=(40, 60)))
    server.start()
    try:
        engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=96)
        one_at_a_time = {"initial_in_flight": 1, "min_in_flight": 1, "max_in_flight": 1}
        settings = RunnerSettings(backoff_base_s=0.0, backoff_cap_s=0.0, progress_bar=False, **one_at_a_time)
        store = ShardStore(str(tmp_path))
        run_generation(engine, spec, prompt_shards(1, 10), store, settings=settings, log=lambda _: None)
    finally:
        server.stop()
    record = validate(spec, store, ["00000"], workers=1, log=lambda _: None).records["00000"]
    gates = {r.name: r for r in record.results}
    assert not gates["failed_rate"].passed and gates["failed_rate"].figure == pytest.approx(0.6)
    assert not gates["empty_response"].passed
    assert "60.0% of 10 replies were empty" in gates["empty_response"].message
    assert "6 of them rows that failed after empty replies" in gates["empty_response"].message


# ---- length_shift, shard by shard ------------------------------------------------------------------------
def shortened(frame: pl.DataFrame, words: int) -> pl.DataFrame:
    """A generation shard whose replies keep their first `words` words (reasoning and content each)."""
    cut = [" ".join(text.split()[:words]) for text in frame["content"]]
    thought = [" ".join(text.split()[:words]) for text in frame["reasoning"]]
    messages = [[m[0], {**m[1], "content": c, "reasoning": r}] for m, c, r in zip(frame["messages"], cut, thought,
                                                                                 strict=True)]  # fmt: skip
    return frame.with_columns(
        content=pl.Series(cut), reasoning=pl.Series(thought),
        completion_tokens=pl.Series([len(c.split()) + len(r.split()) for c, r in zip(cut, thought, strict=True)]),
        messages=pl.Series(messages, dtype=pl.List(MESSAGE_DTYPE)),
    )  # fmt: skip


def test_length_shift_compares_each_shard_with_its_own_last_validation(tmp_path: Path) -> None:
    """The real `{ds}_validated`: shard 00001 (replies of about 40 tokens) after shard 00000 (about 200) has no
    earlier figure of its own, so it is not compared with 00000's; validated again, it is compared with itself."""
    spec = DatasetSpec(
        name="b9_shift", title="Shift", adapter=Adapter(prompt_field="q", response_field="r"), max_prompts=400,
        shard_size=200, target="qwen3-test",
    )  # fmt: skip
    store = ShardStore(str(tmp_path))
    store.write_shard(spec.name, spec.name, "00000", generation_frame(200, empty_share=0.0, dataset=spec.name))
    store.write_shard(spec.name, spec.name, "00001", shortened(generation_frame(200, 0.0, dataset=spec.name), 20))
    defs = dg.Definitions(
        assets=build_dataset_assets(spec), asset_checks=build_checks([spec]),
        resources={**shard_resources(StorageResource(root=str(tmp_path))), "engine": EngineResource()},
    )  # fmt: skip
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={dg.AssetKey("b9_shift_validated")})
    shifts = []
    with dg.instance_for_test() as instance:
        for key in ("00000", "00001", "00001"):
            result = job.execute_in_process(partition_key=key, instance=instance, raise_on_error=False)
            shifts += [e for e in result.get_asset_check_evaluations() if e.check_name == "length_shift"]
    first, second, again = shifts
    assert (first.passed, second.passed, again.passed) == (True, True, True)
    assert "no previous figure" in (second.description or "")  # not 00000's ~200 tokens against its ~40
    own = second.metadata["avg_completion_tokens"].value
    assert again.metadata["previous_avg_completion_tokens"].value == pytest.approx(own)
    assert "(+0.0%" in (again.description or "")


