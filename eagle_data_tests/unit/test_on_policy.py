"""The on-policy score (eagle_data/quality/on_policy.py, eagle_data/engines/scoring.py) on a real instruct model,
SmolLM2-135M-Instruct: its own greedy and sampled rows pass, the sample dataset's original answers and rows
rendered without the template's default system turn fail with the cause named; the SGLang and vLLM stand-ins
answer input-log-probability requests in the engines' formats with the real model, and the scorers read them;
a scorer of another vocabulary and a server that ignores the request are one line before any forward pass."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
from aiohttp import web

from eagle_data import layout, quality
from eagle_data.catalog import Checks, OnPolicy, load_catalog
from eagle_data.drafter.capture import TransformersBackend, capture_shard
from eagle_data.drafter.layers import resolve
from eagle_data.drafter.settings import CaptureSettings
from eagle_data.engines import make_engine
from eagle_data.engines.batched import TOP_K
from eagle_data.engines.scoring import (
    Row,
    ScorerError,
    SGLangScorer,
    TargetIds,
    TransformersScorer,
    VLLMScorer,
    head_figures,
    score_rows,
)
from eagle_data.quality import on_policy as op
from eagle_data.quality.canary import judge as canary_judge
from eagle_data.quality.figures import Figures, on_policy_bins, on_policy_numbers, on_policy_rolled
from eagle_data.quality.verdicts import KEPT
from eagle_data.report import render_report
from eagle_data.standins import model_rows as smol_rows
from eagle_data.standins.openai_fake import FakeOpenAI, Faults
from eagle_data.standins.sglang_fake import FakeSGLang
from eagle_data.storage import ShardStore
from eagle_data_tests.fixtures_quality import validated_frame, varied_replies
from eagle_data_tests.fixtures_stages import generate, validate, write_prompts

PROMPTS = 12
REPLY_TOKENS = 24
GREEDY, SAMPLED = op.SamplingPoint(0.0), op.SamplingPoint(0.8, 0.95)
LIMITS = op.Limits()


@pytest.fixture(scope="module")
def smol() -> smol_rows.Smol:
    return smol_rows.load_smol()


@pytest.fixture(scope="module")
def sets(smol: smol_rows.Smol) -> dict[str, list[Row]]:
    """The model's own greedy and T=0.8 replies to 12 sample prompts, the sample's original answers, and the
    greedy replies under a prompt rendered without the default system turn."""
    items = smol_rows.sample_prompts(PROMPTS)
    prompts = [smol_rows.prompt_ids(smol, text) for text, _ in items]
    bare = [smol_rows.prompt_ids(smol, text, system=False) for text, _ in items]
    greedy = smol_rows.generate(smol, prompts, 0.0, 1.0, REPLY_TOKENS)
    sampled = smol_rows.generate(smol, prompts, SAMPLED.temperature, SAMPLED.top_p, REPLY_TOKENS, seed=1)
    original = [smol_rows.text_reply(smol, answer) for _, answer in items]
    return {
        "greedy": smol_rows.rows(prompts, greedy, GREEDY),
        "sampled": smol_rows.rows(prompts, sampled, SAMPLED),
        "original": smol_rows.rows(prompts, original, GREEDY),
        "no_system": smol_rows.rows(bare, greedy, GREEDY),
    }


def verdict(rows: list[Row], smol: smol_rows.Smol) -> op.Verdict:
    return op.judge(op.totals(score_rows(rows, TransformersScorer(smol.folder), smol.ids, 20)), LIMITS)


@pytest.mark.parametrize("point", [GREEDY, SAMPLED, op.SamplingPoint(0.7, 1.0, 0, 50)])
def test_head_figures_in_blocks_equal_one_pass_over_the_whole_vocabulary(point: op.SamplingPoint) -> None:
    """The scorer's vocabulary-wide work goes a block of positions at a time; each position's figures are the
    ones one pass over every position gives, bit for bit (Qwen3's vocabulary, 38 supervised positions)."""
    torch.manual_seed(0)
    length, vocab = 40, 151_936
    hidden, head = torch.randn(length, 32), torch.nn.Linear(32, vocab, bias=False)
    row = Row(torch.randint(vocab, (length,)).tolist(), [0, 0] + [1] * (length - 2), point)
    with torch.inference_mode():
        got = head_figures(torch, hidden, head, row, 20)
        positions = torch.arange(2, length)
        logp = torch.log_softmax(head(hidden[positions - 1]), dim=-1)
    top = torch.topk(logp, max(20, point.top_k + 1), dim=-1)
    ids = torch.tensor(row.input_ids[2:])
    assert np.array_equal(got.tokens, ids) and np.array_equal(got.token_logp, logp.gather(1, ids[:, None])[:, 0])
    assert np.array_equal(got.top_ids, top.indices) and np.array_equal(got.top_logp, top.values)
    if point.temperature > 0:
        assert np.array_equal(got.log_z, torch.logsumexp(logp / point.temperature, dim=-1))
    else:
        assert got.log_z is None


def test_the_models_own_greedy_rows_pass_with_agreement_at_least_095(sets: dict, smol: smol_rows.Smol) -> None:
    judged = verdict(sets["greedy"], smol)
    assert judged.passed, judged.line
    assert judged.details["on_policy_agreement"] >= 0.95
    assert judged.details["on_policy_expected_agreement"] == 1.0


def test_the_models_own_sampled_rows_pass_within_what_their_tempered_distribution_predicts(
    sets: dict, smol: smol_rows.Smol
) -> None:
    judged = verdict(sets["sampled"], smol)
    assert judged.passed, judged.line
    observed, expected = judged.details["on_policy_agreement"], judged.details["on_policy_expected_agreement"]
    assert expected < 0.95  # T=0.8 predicts many non-argmax tokens: the bar is the distribution's, not 1
    assert judged.details["agreement_shortfall_bound"] <= LIMITS.agreement_tolerance
    assert abs(observed - expected) < 0.1, judged.line
    # the same replies judged as if greedy fail: the expectation is what lets sampled data pass
    as_greedy = [Row(r.input_ids, r.loss_mask, GREEDY) for r in sets["sampled"]]
    assert not verdict(as_greedy, smol).passed


def test_the_datasets_original_answers_fail_naming_replies_not_the_targets(sets: dict, smol: smol_rows.Smol) -> None:
    judged = verdict(sets["original"], smol)
    assert not judged.passed
    assert judged.cause == "not_target"
    assert "not the target's" in judged.line and "\n" not in judged.line


def test_word_salad_fails_though_every_token_is_in_the_targets_vocabulary(smol: smol_rows.Smol) -> None:
    """The random-weight stand-in's replies (ASCII word salad), re-tokenized for SmolLM2: ids, masks and structure
    are all well-formed, so only the target's own likelihood tells them from its replies (issue 40's word salad)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle_data.standins.random_model import ensure_random_model

    folder = ensure_random_model()
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval()
    salad = []
    for i in range(PROMPTS):
        torch.manual_seed(i)
        out = model.generate(torch.tensor([[tokenizer.eos_token_id]]), max_new_tokens=REPLY_TOKENS, do_sample=True,
                             min_new_tokens=REPLY_TOKENS, pad_token_id=tokenizer.eos_token_id)  # fmt: skip
        salad.append(smol_rows.text_reply(smol, tokenizer.decode(out[0, 1:], skip_special_tokens=True)))
    prompts = [smol_rows.prompt_ids(smol, text) for text, _ in smol_rows.sample_prompts(PROMPTS)]
    judged = verdict(smol_rows.rows(prompts, salad, GREEDY), smol)
    assert not judged.passed and judged.cause == "not_target", judged.line
    assert judged.details["on_policy_agreement"] < 0.3


def test_rows_rendered_without_the_default_system_turn_fail_naming_the_rendering(
    sets: dict, smol: smol_rows.Smol
) -> None:
    judged = verdict(sets["no_system"], smol)
    assert not judged.passed, judged.line
    assert judged.cause == "rendering"
    assert "first reply token" in judged.line


@pytest.fixture
def sglang(smol: smol_rows.Smol) -> Iterator[tuple[str, FakeSGLang, FakeSGLang]]:
    """Two SGLang stand-ins on 127.0.0.1: one scoring with SmolLM2, one that ignores return_logprob."""
    fakes = (FakeSGLang(model="smol", score_model=str(smol.folder)), FakeSGLang(model="smol"))
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []
    ports: list[int] = []

    async def start() -> None:
        for fake in fakes:
            runner = web.AppRunner(fake.app(), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield f"http://127.0.0.1:{ports[0]}|http://127.0.0.1:{ports[1]}", fakes[0], fakes[1]
    finally:
        for runner in runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _same_figures(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x["tokens"], x["hits"], x["first_hits"]) == (y["tokens"], y["hits"], y["first_hits"])
        assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-3 * x["tokens"])
        assert x["expected_logprob"] == pytest.approx(y["expected_logprob"], abs=0.05 * x["tokens"])


def test_sglang_stand_in_answers_input_logprobs_as_sglang_and_the_scorer_reads_them(
    sets: dict, smol: smol_rows.Smol, sglang: tuple[str, FakeSGLang, FakeSGLang]
) -> None:
    urls, scoring, _ = sglang
    rows = sets["sampled"][:4]
    served = score_rows(rows, SGLangScorer(urls.split("|")[0]), smol.ids, 20)
    body = scoring.requests[0]
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 20
    first = rows[0].loss_mask.index(1)
    assert body["logprob_start_len"] == first - 1  # SGLang's first entry carries no value: start one before
    _same_figures(served, score_rows(rows, TransformersScorer(smol.folder), smol.ids, 20))


def test_vllm_stand_in_answers_prompt_logprobs_as_vllm_and_the_scorer_reads_them(
    sets: dict, smol: smol_rows.Smol
) -> None:
    fake = FakeOpenAI(Faults(score_model=str(smol.folder), served_models=("smol",)))
    url = fake.start()
    try:
        rows = sets["sampled"][:4]
        served = score_rows(rows, VLLMScorer(url), smol.ids, 20)
    finally:
        fake.stop()
    _same_figures(served, score_rows(rows, TransformersScorer(smol.folder), smol.ids, 20))


def test_a_server_ignoring_the_logprob_request_or_of_another_vocabulary_is_one_line_on_its_first_answer(
    sets: dict, smol: smol_rows.Smol, sglang: tuple[str, FakeSGLang, FakeSGLang]
) -> None:
    urls, scoring, ignoring = sglang
    with pytest.raises(ScorerError, match="ignores return_logprob") as caught:
        score_rows(sets["greedy"], SGLangScorer(urls.split("|")[1]), smol.ids, 20)
    assert len(ignoring.requests) == 1 and "\n" not in str(caught.value)
    before = len(scoring.requests)  # a server of another vocabulary: its first answer names ids past the target's
    with pytest.raises(ScorerError, match="past the rows' target vocabulary"):
        score_rows(sets["greedy"], SGLangScorer(urls.split("|")[0]), TargetIds(1000, 2), 20)
    assert len(scoring.requests) == before + 1
    fake = FakeOpenAI(Faults(served_models=("smol",)))
    url = fake.start()
    try:
        with pytest.raises(ScorerError, match="ignores prompt_logprobs"):
            score_rows(sets["greedy"], VLLMScorer(url), smol.ids, 20)
        assert fake.received == 1
    finally:
        fake.stop()


def test_a_scorer_of_another_vocabulary_is_refused_before_any_forward_pass(
    sets: dict, demo_model: Any, smol: smol_rows.Smol
) -> None:
    qwen = TransformersScorer(demo_model)
    _, model = qwen._load()
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ScorerError, match="is not the rows' target") as caught:
            score_rows(sets["greedy"], qwen, smol.ids, 20)
    finally:
        hook.remove()
    assert not calls and "\n" not in str(caught.value)


# ---- the math on a known distribution (no model) ----------------------------------------------------------


def _softmax_rows(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    logits = rng.normal(0, 2.5, (n, vocab))
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))


def _scored(logp: np.ndarray, tokens: np.ndarray, point: op.SamplingPoint, k: int) -> op.Scored:
    order = np.argsort(-logp, axis=1)[:, :k]
    log_z = np.log(np.exp(logp / point.temperature).sum(1)) if point.temperature > 0 else None
    return op.Scored(tokens, logp[np.arange(len(tokens)), tokens], order, np.take_along_axis(logp, order, 1), log_z)


@pytest.mark.parametrize(
    "point",
    [
        op.SamplingPoint(0.7, 0.9),
        op.SamplingPoint(1.0, 1.0),
        op.SamplingPoint(1.3, 0.8),
        op.SamplingPoint(0.8, 0.95, 0, 5),
    ],
)
def test_expectations_equal_the_tempered_truncated_distribution_computed_directly(point: op.SamplingPoint) -> None:
    rng = np.random.default_rng(0)
    logp = _softmax_rows(rng, 50, 40)
    hit, mean, var = op.expectations(_scored(logp, np.zeros(50, int), point, 40).top_logp, point, None)
    for p in range(50):
        q = np.exp(logp[p] / point.temperature)
        order = np.argsort(-q)
        if point.top_k:
            q[order[point.top_k :]] = 0.0
        q /= q.sum()
        keep = order[(np.cumsum(q[order]) - q[order]) < point.top_p]
        nucleus = np.zeros_like(q)
        nucleus[keep] = q[keep] / q[keep].sum()
        assert hit[p] == pytest.approx(nucleus[order[0]])
        assert mean[p] == pytest.approx((nucleus * logp[p]).sum())
        assert var[p] == pytest.approx((nucleus * (logp[p] - mean[p]) ** 2).sum())


def test_rows_drawn_from_the_distribution_pass_and_drawn_from_another_fail() -> None:
    rng = np.random.default_rng(1)
    point, n = op.SamplingPoint(0.8, 0.95), 3000
    logp = _softmax_rows(rng, n, 30)
    q = np.exp(logp / point.temperature)
    q /= q.sum(1, keepdims=True)
    own = np.array([rng.choice(30, p=row) for row in q])
    other = rng.integers(0, 30, n)
    labels = np.full(n, op.REST)
    for tokens, passes in ((own, True), (other, False)):
        figures = op.row_figures(_scored(logp, tokens, point, 30), labels, point, "test")
        assert op.judge(op.totals([figures]), LIMITS).passed is passes


def test_min_tokens_takes_the_blocked_end_of_turn_out_of_the_distribution() -> None:
    logp = np.log(np.array([[0.6, 0.3, 0.1]]))
    point = op.SamplingPoint(1.0, 1.0, min_tokens=5)
    scored = op.without_token(_scored(logp, np.array([1]), point, 3), np.array([True]), 0, point)
    assert list(scored.top_ids[0]) == [1, 2]
    assert np.exp(scored.top_logp[0]) == pytest.approx([0.75, 0.25])
    assert op.expectations(scored.top_logp, point, scored.log_z)[0][0] == pytest.approx(0.75)


def test_a_rows_top_k_is_the_one_its_engine_config_names(demo_model: Path) -> None:
    """The embedded engine names the top-k it sampled with (transformers' default 50 unless the checkpoint sets
    one): its rows are predicted under that cut; a server's rows name none."""
    config = make_engine("local", model=str(demo_model), temperature=0.8, top_p=0.95, min_tokens=24).config()
    local = op.row_sampling(json.dumps(config), "", GREEDY)
    served = op.row_sampling('{"engine": "sglang", "temperature": 0.8, "top_p": 0.95}', "", GREEDY)
    assert (local.top_k, local.min_tokens, served.top_k) == (TOP_K, 24, 0) and TOP_K == 50
    mixed = '{"temperature": 0.7, "mixture": [{"name": "cold", "temperature": 0.2}]}'
    assert op.row_sampling(mixed, "cold", GREEDY).temperature == 0.2


def test_a_row_is_scored_on_its_final_reply() -> None:
    assert op.final_reply([0, 1, 1, 0, 0, 1, 1, 1, 0]) == [0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert op.final_reply([0, 0]) == [0, 0] and op.final_reply([1, 1]) == [1, 1]


def test_segments_place_the_first_reply_token_and_the_think_block() -> None:
    think = (7, 8)
    ids = [1, 2, 7, 5, 8, 9, 9, 9, 3, 4, 6]
    mask = [0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1]
    assert op.segments(ids, mask, think).tolist() == [op.FIRST, op.THINK, op.THINK, op.THINK, op.THINK, op.REST,
                                                      op.FIRST, op.REST]  # fmt: skip


def test_a_capture_records_the_figures_from_its_own_forward_passes(
    sets: dict, smol: smol_rows.Smol, tmp_path: Path
) -> None:
    rows = sets["greedy"]
    frame = pl.DataFrame(
        {"row": list(range(len(rows))), "prompt_id": [f"p{i}" for i in range(len(rows))],
         "input_ids": [list(r.input_ids) for r in rows], "loss_mask": [list(r.loss_mask) for r in rows],
         "sampling": ['{"temperature": 0.0}'] * len(rows)},
        schema_overrides={"row": pl.Int64, "input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8)},
    )  # fmt: skip
    settings = CaptureSettings(formats=("native",), dtype="fp32", batch_tokens=400, on_policy_rows=len(rows))
    backend = TransformersBackend(smol.folder, "cpu", "fp32")
    forwards: list[int] = []
    head_rows: list[int] = []
    hooks = [
        backend.model.register_forward_pre_hook(lambda *_: forwards.append(1)),
        backend.head.register_forward_hook(lambda _m, args, _o: head_rows.append(args[0].shape[0])),
    ]
    try:
        result = capture_shard(
            ShardStore(str(tmp_path)), "cid", "00000", frame, {"formats": ["native"]}, backend,
            resolve(settings, backend.num_layers), settings, print, smol.ids,
        )  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    assert len(forwards) == result.batches_run  # one forward pass per batch: none added for the figures
    assert sum(head_rows) == sum(sum(r.loss_mask) for r in rows)  # the head ran on supervised positions only
    figures = result.record[op.COLUMN]["figures"]
    assert figures["on_policy_rows"] == len(rows) and figures["on_policy_agreement"] >= 0.95
    by_scorer = score_rows(rows, TransformersScorer(smol.folder), smol.ids, 20)
    captured = [result.record[op.COLUMN]["rows"][str(i)] for i in range(len(rows))]
    assert [c["hits"] for c in captured] == [s["hits"] for s in by_scorer]


def test_validation_scores_the_embedded_engines_rows_and_a_wrong_scorer_is_one_line(
    demo_model: Path, smol: smol_rows.Smol, tmp_path: Path
) -> None:
    """The demo profile's own run on the random-weight model (its sampling settings, 4 prompts): validation scores
    a sample of its rows with the checkpoint that generated them and the shard passes; told to score with
    another model's checkpoint, validation stops in one line before any forward pass."""
    spec = load_catalog(profile="demo")["b3_magicoder"].model_copy(deep=True, update={"max_prompts": 4})
    store, parts = ShardStore(str(tmp_path)), ["00000"]
    write_prompts(spec, store, parts)
    generate(spec, store, parts, make_engine("local", model=str(demo_model), **spec.generation.model_dump()))
    done = validate(spec, store, parts)
    shard = store.read_shard(spec.name, layout.validated_asset(spec.name), "00000")
    scored = [r for r in shard[op.COLUMN].to_list() if r]
    assert len(scored) == min(spec.on_policy.sample_rows, int(shard["verdict"].is_in(list(KEPT)).sum())) > 0
    point = ("transformers", spec.generation.temperature, TOP_K)
    assert {(r["scorer"], r["temperature"], r["top_k"]) for r in scored} == {point}
    judged = op.shard_verdict(shard, op.limits_of(spec.on_policy))
    assert judged.passed, judged.line
    assert done.records["00000"].numbers["on_policy_rows"] == len(scored)
    wrong = spec.model_copy(update={"on_policy": OnPolicy(scorer="transformers", checkpoint=str(smol.folder))})
    with pytest.raises(ScorerError, match="is not the rows' target") as caught:
        validate(wrong, store, parts)
    assert "\n" not in str(caught.value)


def _scored_row(tokens: int, hits: int) -> dict[str, Any]:
    zero = dict.fromkeys(op.SUMMED, 0)
    given = {"tokens": tokens, "hits": hits, "expected_hits": float(tokens), "logprob": -0.5 * tokens}
    return {**zero, **given, "scorer": "transformers", "temperature": 0.0, "top_p": 1.0, "top_k": 0}


def test_shard_figures_add_up_to_the_dataset_and_its_page_draws_the_histogram() -> None:
    shards = [
        pl.DataFrame({op.COLUMN: [_scored_row(100, 99), None, _scored_row(50, 20)]}, schema={op.COLUMN: op.ROW_DTYPE}),
        pl.DataFrame({op.COLUMN: [_scored_row(10, 10)]}, schema={op.COLUMN: op.ROW_DTYPE}),
    ]
    numbers = [on_policy_numbers(shard) for shard in shards]
    assert numbers[0]["on_policy_rows"] == 2 and numbers[0]["on_policy_rows_agreement_0.99-1"] == 1
    dataset = on_policy_rolled(numbers)
    assert (dataset["on_policy_rows"], dataset["on_policy_tokens"]) == (3, 160)
    assert dataset["on_policy_agreement"] == round(129 / 160, 4)
    assert dict(on_policy_bins(dataset)) == {"0-0.5": 1, "0.5-0.8": 0, "0.8-0.9": 0, "0.9-0.95": 0,
                                                "0.95-0.99": 0, "0.99-1": 2}  # fmt: skip
    page = render_report("fixture", Figures(dataset, {}, [], [], [], {}, []), [], "ds").decode()
    assert "On-policy score" in page and "ds_on_policy" in page
    assert on_policy_numbers(pl.DataFrame({"prompt_id": ["a"]})) == {} and on_policy_rolled([{}]) == {}


def test_the_canary_fails_on_a_sample_the_target_would_not_have_written_naming_the_cause() -> None:
    """Rows whose first reply token the target rejects (a rendering that differs from the server's) pass every
    gate, yet the canary stops the run before it pays for the rest."""
    frame = quality.row_verdicts(validated_frame(varied_replies(64)), Checks(), thinking=True)
    own = {**_scored_row(40, 40), "first_tokens": 1, "first_hits": 1, "first_expected": 1.0}
    misrendered = {**_scored_row(40, 34), "first_tokens": 1, "first_hits": 0, "first_expected": 1.0}

    def sample(row: dict[str, Any]) -> pl.DataFrame:
        return frame.with_columns(pl.Series(op.COLUMN, [row] * frame.height, dtype=op.ROW_DTYPE))

    settings = dict(dataset="fx", max_tokens=4096, suggested_max_tokens=256, config_hash="h")
    assert canary_judge(sample(own), Checks(), True, **settings, on_policy_limits=LIMITS).passed
    failed = canary_judge(sample(misrendered), Checks(), True, **settings, on_policy_limits=LIMITS)
    assert failed.failing == ("on_policy",)
    assert "rendering differs from the server's" in failed.line and "\n" not in failed.line
