import asyncio
from pathlib import Path

import pytest

from eagle_data.catalog import Generation, OnPolicy
from eagle_data.engines import EngineSettings, build_engine, make_engine
from eagle_data.engines.local import LocalEngine, _fingerprint
from eagle_data.engines.replies import completion_from_ids
from eagle_data.quality import sampled
from eagle_data.runner.resultlog import resume_key
from eagle_data.standins import model_logprobs
from eagle_data.standins.openai_fake import spec_for_tests
from eagle_data.targets.reasoning import THINK_TAGS
from eagle_data.types import Completion, FatalError

GEN = Generation(max_tokens=40, min_tokens=8, temperature=0.8, top_p=0.95, thinking=False)
CHAT = [{"role": "user", "content": "Write a haiku about compilers."}]


@pytest.fixture(scope="module")
def engine(demo_model: Path) -> LocalEngine:
    return LocalEngine(demo_model, GEN, demo=True)


def test_local_engine_returns_its_own_tokens(engine: LocalEngine):
    tokenizer, _ = engine._load()
    done = asyncio.run(engine.complete(CHAT, prompt_id="p1"))
    assert done.output_ids and 8 <= done.completion_tokens == len(done.output_ids) <= 40
    stopped = done.output_ids[-1] == tokenizer.eos_token_id
    assert done.finish_reason == ("stop" if stopped else "length")
    body = done.output_ids[:-1] if stopped else done.output_ids
    assert done.content == tokenizer.decode(body).lstrip("\n")
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=False, return_dict=True)
    assert done.prompt_tokens == len(prompt["input_ids"])


def test_local_engine_is_reproducible_per_prompt(engine: LocalEngine):
    a = asyncio.run(engine.complete(CHAT, prompt_id="same"))
    b = asyncio.run(engine.complete(CHAT, prompt_id="same"))
    c = asyncio.run(engine.complete(CHAT, prompt_id="other"))
    assert a.output_ids == b.output_ids != c.output_ids


def test_engines_share_a_loaded_checkpoint_until_it_is_rewritten(engine: LocalEngine, tmp_path: Path):
    """Each run builds its own engine: the next run in this process must not load the model again."""
    assert LocalEngine(engine.model_path, GEN)._load() is engine._load()
    (tmp_path / "config.json").write_text("{}")
    before = _fingerprint(tmp_path)
    (tmp_path / "config.json").write_text('{"rewritten": true}')
    assert _fingerprint(tmp_path) != before


def test_reasoning_is_split_at_the_think_end_token(engine: LocalEngine):
    tokenizer, _ = engine._load()
    ids = tokenizer.encode("<think>\nstep one\n</think>\n\nThe answer.<|im_end|>", add_special_tokens=False)
    done = completion_from_ids(tokenizer, ids, [0] * 5, THINK_TAGS, "local")
    assert (done.reasoning, done.content, done.finish_reason) == ("step one", "The answer.", "stop")
    cut = completion_from_ids(tokenizer, ids[:-1], [0] * 5, THINK_TAGS, "local")
    assert cut.finish_reason == "length" and cut.truncated


def test_two_checkpoints_with_the_same_folder_name_never_share_a_resume_key(tmp_path: Path):
    for run in ("a", "b"):
        (tmp_path / run / "final").mkdir(parents=True)
        (tmp_path / run / "final" / "config.json").write_text("{}")  # only the folder's presence is checked here
    a, b = (make_engine("local", model=str(tmp_path / run / "final"), **GEN.model_dump()) for run in ("a", "b"))
    spec = spec_for_tests()
    assert resume_key(a.config(), spec).config_hash != resume_key(b.config(), spec).config_hash
    assert a.config()["model"] == str((tmp_path / "a" / "final").resolve()) and a.config()["max_tokens"] == 40
    assert (a.model, b.model) == (a.config()["model"], b.config()["model"])  # rows name the checkpoint itself


def test_missing_checkpoint_is_a_one_line_error(tmp_path: Path):
    with pytest.raises(FatalError) as err:
        make_engine("local", model=str(tmp_path / "nothing"), **GEN.model_dump())
    assert "nothing" in str(err.value) and "eagle-data demo-model" in str(err.value)


def test_the_demo_model_says_so_in_what_it_reports(demo_model: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model))
    demo = make_engine("local", model=str(demo_model), **GEN.model_dump())
    assert demo.describe() == "local (the demo model)"
    assert "the demo model" in (line := asyncio.run(demo.check())) and str(demo_model.resolve()) in line
    monkeypatch.setenv("EAGLE_DATA_DEMO_MODEL", str(demo_model.parent / "elsewhere"))
    assert make_engine("local", model=str(demo_model), **GEN.model_dump()).describe() == f"local {demo_model.resolve()}"


QUESTIONS = (
    "What is the capital of France?", "Write a haiku about compilers.", "Explain recursion in one sentence.",
    "List three fruits.", "What is 2+2?", "Name a famous painter.", "Why is the sky blue?", "Say hello.",
)  # fmt: skip
SHORT = {"max_tokens": 24, "min_tokens": 0, "top_p": 0.9, "thinking": False}


def _together(*asks: tuple[LocalEngine, int]) -> list[Completion]:
    """Every (engine, question) asked at once, as the runner asks: the prompt id names the question."""

    async def gather() -> list[Completion]:
        return await asyncio.gather(
            *(engine.complete([{"role": "user", "content": QUESTIONS[i]}], prompt_id=f"q{i}") for engine, i in asks)
        )

    return asyncio.run(gather())


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_requests_in_flight_go_in_one_batch_and_each_gets_the_ids_it_gets_alone(smollm2: Path, temperature: float):
    """Greedy: the same ids exactly; sampled: each row draws from its own generator seeded from its prompt."""
    engine = LocalEngine(smollm2, Generation(temperature=temperature, **SHORT), batch_size=8, threads=1)
    batched = _together(*((engine, i) for i in range(8)))
    assert engine.stats() == {"batches": 1, "rows_per_batch": 8, "torch_threads": 1}
    alone = LocalEngine(smollm2, Generation(temperature=temperature, **SHORT), threads=1)
    for i in (0, 6):
        (single,) = _together((alone, i))
        assert single.output_ids == batched[i].output_ids and single.finish_reason == batched[i].finish_reason
    assert alone.stats()["batches"] == 2 and alone.stats()["rows_per_batch"] == 1
    assert len({tuple(done.output_ids) for done in batched}) == 8
    assert batched[3].output_ids == _bare_generate(engine, 3)  # what one seeded `generate` of it makes


def test_requests_arriving_a_fifth_of_a_second_apart_still_go_in_one_batch(smollm2: Path):
    """Regression: a busy machine stalls the runner between its requests, and a batch that waited 50 ms for the
    next one split the demo's 12 prompts into batches of 7 and 5 (as many steps again)."""
    engine = LocalEngine(smollm2, Generation(temperature=0.0, **SHORT), batch_size=4, threads=1)

    async def staggered() -> list[Completion]:
        async def ask(i: int) -> Completion:
            await asyncio.sleep(0.2 * i)
            return await engine.complete([{"role": "user", "content": QUESTIONS[i]}], prompt_id=f"q{i}")

        return await asyncio.gather(*(ask(i) for i in range(4)))

    assert len(asyncio.run(staggered())) == 4
    assert engine.stats() == {"batches": 1, "rows_per_batch": 4, "torch_threads": 1}


def _bare_generate(engine: LocalEngine, question: int) -> list[int]:
    """One `model.generate` of one question, sampling (if at all) from torch's generator seeded as the engine
    seeds that prompt: the ids through the end of the turn."""
    import hashlib

    import torch

    tokenizer, model = engine._load()
    chat = [{"role": "user", "content": QUESTIONS[question]}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    g = engine.generation
    torch.manual_seed(int(hashlib.sha256(f"q{question}:1".encode()).hexdigest()[:8], 16))
    out = model.generate(**prompt, max_new_tokens=g.max_tokens, do_sample=g.temperature > 0,
                         temperature=g.temperature or None, top_p=g.top_p,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    ids = out[0, prompt["input_ids"].shape[1] :].tolist()
    return ids[: ids.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in ids else ids


def test_each_row_of_a_batch_keeps_its_own_lengths_sampling_and_finish_reason(smollm2: Path):
    """Two runs' engines on one checkpoint share a batch; each row keeps its own engine's settings."""
    short = LocalEngine(smollm2, Generation(temperature=0.0, **{**SHORT, "max_tokens": 5}), threads=1)
    long = LocalEngine(smollm2, Generation(temperature=0.7, **{**SHORT, "min_tokens": 20, "max_tokens": 30}), threads=1)
    tokenizer, _ = short._load()
    done = _together((short, 0), (long, 0), (short, 4), (long, 4))
    assert short.stats()["batches"] == long.stats()["batches"] == 1  # one batch of the four
    for reply, (low, high) in zip(done, [(1, 5), (20, 30)] * 2, strict=True):
        assert low <= reply.completion_tokens == len(reply.output_ids) <= high
        stopped = reply.output_ids[-1] == tokenizer.eos_token_id
        assert reply.finish_reason == ("stop" if stopped else "length")
        assert tokenizer.eos_token_id not in reply.output_ids[:-1]  # nothing after the end of the turn
    assert done[0].finish_reason == "length" and done[0].content == "The capital of France is"  # greedy, cut at 5
    assert done[1].output_ids != done[0].output_ids


def test_rows_that_have_ended_leave_the_batch_and_the_rest_keep_their_ids(smollm2: Path):
    """Once half a batch has reached its end, the model computes only the rows still going: `generate` alone
    would compute all four until the longest ended. The two long rows get the ids they get in a batch of
    their own."""
    short = LocalEngine(smollm2, Generation(temperature=0.0, **{**SHORT, "max_tokens": 5}), threads=1)
    long = LocalEngine(smollm2, Generation(temperature=0.7, **{**SHORT, "min_tokens": 20, "max_tokens": 30}), threads=1)
    _, model = short._load()
    sizes: list[int] = []
    hook = model.register_forward_pre_hook(lambda _, args, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        done = _together((short, 0), (long, 0), (short, 4), (long, 4))
    finally:
        hook.remove()
    assert sizes.count(4) == 5 and set(sizes[5:]) == {2}  # the short rows' 5 tokens, then the long rows alone
    assert len(sizes) == max(done[1].completion_tokens, done[3].completion_tokens)  # a forward per token
    assert [reply.output_ids for reply in _together((long, 0), (long, 4))] == [done[1].output_ids, done[3].output_ids]


def test_each_step_of_a_batch_takes_the_thread_count_anew(smollm2: Path, monkeypatch: pytest.MonkeyPatch):
    """A batch runs for minutes; the count it started with must not hold while the machine's load changes: an
    engine without `threads` asks the meter again (`cpus.retune`, still run) at every generated token, through
    the batch's shrinking calls too; one with `threads` set never does."""
    from eagle_data.engines import local
    from eagle_data.engines.batched import Row, generate_rows

    engine = LocalEngine(smollm2, Generation(temperature=0.0, **SHORT))
    tokenizer, model = engine._load()
    rows = [Row(engine._request([{"role": "user", "content": q}], "p").prompt, n, n, 0.0, 1.0, None)
            for q, n in ((QUESTIONS[0], 3), (QUESTIONS[1], 9))]  # fmt: skip
    steps: list[int] = []
    (short, _), (long, _) = generate_rows(model, tokenizer, rows, lambda: steps.append(1))
    assert (len(short), len(long)) == (3, 9) and len(steps) == 9  # 3 steps of both rows, then 6 of the long one

    looks: list[int] = []
    retune = local.retune
    monkeypatch.setattr(local, "retune", lambda: (looks.append(1), retune())[1])
    six = {**SHORT, "max_tokens": 6, "min_tokens": 6}
    (metered,) = _together((LocalEngine(smollm2, Generation(temperature=0.0, **six)), 0))
    assert len(looks) == metered.completion_tokens == 6
    _together((LocalEngine(smollm2, Generation(temperature=0.0, **six), threads=1), 0))
    assert len(looks) == 6


def test_the_thread_count_is_the_setting_or_the_meters(smollm2: Path):
    from eagle_data.engines.cpus import process_meter

    given = LocalEngine(smollm2, Generation(temperature=0.0, **{**SHORT, "max_tokens": 2}), threads=3)
    _together((given, 0))
    assert given.stats()["torch_threads"] == 3
    ruled = LocalEngine(smollm2, Generation(temperature=0.0, **{**SHORT, "max_tokens": 2}))
    _together((ruled, 0))
    meter = process_meter()
    assert ruled.stats()["torch_threads"] == meter.threads <= len(meter.cpus) and meter.others_busy is not None


@pytest.mark.parametrize("temperature", [0.0, 0.7], ids=["greedy", "sampled"])
def test_asked_the_local_engine_reports_its_tokens_log_probabilities_from_the_logits_it_sampled(
    demo_model: Path, temperature: float
):
    """`[defaults.on_policy] sampled_logprobs` on: each reply's figures are its own tokens' log-probabilities and
    ranks under the model at T = 1 (one forward pass over prompt and reply agrees), read while generating; the
    ids and the resume key are those of the same run without the setting."""
    k = 3
    generation = Generation(temperature=temperature, **SHORT)
    asking_spec = spec_for_tests(generation=generation, on_policy=OnPolicy(sampled_logprobs=True, top_logprobs=k))
    plain_spec = spec_for_tests(generation=generation)
    settings = EngineSettings(kind="local", model=str(demo_model), threads=1)
    asking, plain = build_engine(settings, asking_spec), build_engine(settings, plain_spec)
    assert resume_key(asking.config(), asking_spec) == resume_key(plain.config(), plain_spec)
    asked, made = _together(*((asking, i) for i in range(4))), _together(*((plain, i) for i in range(4)))
    assert [done.output_ids for done in asked] == [done.output_ids for done in made]
    assert {done.sampled_logprobs is None for done in made} == {True}
    for done in asked:
        ids = [*done.prompt_ids, *done.output_ids]
        expected = model_logprobs.logprobs(str(demo_model), ids)
        reply = range(len(done.prompt_ids), len(ids))
        ranks = [min(model_logprobs.rank(expected[t], ids[t]) - 1, k - 1) for t in reply]
        figures = done.sampled_logprobs
        assert figures is not None and figures["tokens"] == len(done.output_ids)
        assert figures["logprob"] == pytest.approx(sum(float(expected[t, ids[t]]) for t in reply), abs=1e-3)
        assert figures["ranks"] == sampled.figures([0.0] * len(ranks), ranks, k)["ranks"]
        assert temperature or figures["ranks"] == [len(done.output_ids), 0, 0]  # greedy: always the top token


@pytest.mark.parametrize("top_k", [50, 0])
def test_a_sampled_step_leaves_the_token_transformers_warpers_and_multinomial_draw_with_the_same_seed(top_k: int):
    """The batched sampler cuts top-p over top-k's survivors and draws only their exponentials: on Qwen3's
    vocabulary size, 100 steps leave the same token standing, and the generator in the same state, as
    transformers' warpers and torch.multinomial over the whole vocabulary (top_k 0: top-p over all of it)."""
    import torch
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from eagle_data.engines.batched import Row, _RowSampler

    vocab, ids = 151_936, torch.zeros((1, 4), dtype=torch.long)
    reference = LogitsProcessorList(
        [TemperatureLogitsWarper(0.7), *([TopKLogitsWarper(top_k)] if top_k else []), TopPLogitsWarper(0.95)]
    )
    for seed in range(100):
        scores = torch.randn((1, vocab), generator=torch.Generator().manual_seed(10_000 + seed)) * 4
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        row = Row(prompt=[0] * 4, max_tokens=8, min_tokens=0, temperature=0.7, top_p=0.95, generator=ours)
        kept = _RowSampler([row], start=4, ends=[1], top_k=top_k)(ids, scores.clone())
        drawn = torch.multinomial(torch.softmax(reference(ids, scores.clone()), dim=-1), 1, generator=theirs)
        assert torch.isfinite(kept[0]).nonzero().flatten().tolist() == [drawn.item()]
        assert torch.equal(ours.get_state(), theirs.get_state())
