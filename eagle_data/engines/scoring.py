"""Scorers: the target's own log-probabilities over rows it may or may not have written (the on-policy figures,
`eagle_data/quality/on_policy.py`), from the cheapest place that has the target.

- `TransformersScorer`: a checkpoint in this process (the embedded engine's model): one forward pass of the
  base model per batch (a row on the CPU), then the LM head on the supervised positions only.
- `SGLangScorer`: an SGLang server's `/generate` with `return_logprob`, `logprob_start_len` and
  `top_logprobs_num`: the input tokens' log-probabilities in one prefill request per row.
- `VLLMScorer`: a vLLM server's `/v1/completions` with `prompt_logprobs`.
(The hidden-state capture takes the same figures from the forward pass it already runs: `head_figures`.)

Each takes rows as the validated contract holds them (input_ids, loss_mask) with the sampling settings their
replies were drawn at, and returns one `on_policy.Scored` per row. A scorer whose vocabulary is not the rows'
target is one line (`ScorerError`): in process before its first forward pass, a server (which reports no vocabulary)
on its first answer naming ids past the target's; so is a server that answers without the log-probabilities asked
for, before any further request. docs/quality.md says which the catalog's `[defaults.on_policy]` picks.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl

from eagle_data.catalog import OnPolicy
from eagle_data.engines.cpus import torch_threads
from eagle_data.quality.canary import rank
from eagle_data.quality.on_policy import (
    COLUMN,
    LOCAL_ENGINE,
    ROW_DTYPE,
    SamplingPoint,
    Scored,
    final_reply,
    reply_index,
    row_figures,
    row_sampling,
    segments,
    without_token,
)
from eagle_data.quality.verdicts import KEPT
from eagle_data.targets.derived import DerivedTarget
from eagle_data.targets.reasoning import reasoning_markers
from eagle_data.targets.target import Target
from eagle_data.types import UserError

TIMEOUT_S = 120.0
BATCH_TOKENS = 8192  # padded tokens per forward pass of the in-process scorer on a GPU (a CPU: one row, no padding)
POSITION_BLOCK = 16  # positions per block after the LM head: Qwen3's vocabulary, 20 rows: 5.9-6.8 CPU-s, not 11.2


class ScorerError(UserError, ValueError):
    """A scorer that cannot give the figures asked for; the message says what to set or fix."""


@dataclass(frozen=True)
class Row:
    """One row to score: its ids and loss mask, and the settings its replies were sampled at."""

    input_ids: Sequence[int]
    loss_mask: Sequence[int]
    point: SamplingPoint


class Scorer(Protocol):
    """Runs the target over rows and reports, per supervised position, its log-probabilities."""

    name: str  # the `scorer` field of the figures: transformers, sglang, vllm

    def check_vocab(self, size: int, eot_id: int) -> None:
        """Refuse (one line) a scorer whose vocabulary is not the rows' target: `size` tokens, end of turn
        `eot_id`. Called before any forward pass or request."""
        ...

    def score(self, rows: Sequence[Row], top_k: int) -> list[Scored]:
        """Per row, its supervised positions scored, with the `top_k` most likely tokens at each."""
        ...


def supervised(row: Row) -> np.ndarray:
    """The positions whose tokens are supervised (the first token never is: nothing predicts it)."""
    return np.flatnonzero(np.asarray(row.loss_mask, dtype=bool)[1:]) + 1


def head_figures(torch: Any, hidden: Any, head: Any, row: Row, top_k: int) -> Scored:
    """One row's figures from its final hidden states [len, H] (after the final norm) and the LM head, on the
    positions predicting supervised tokens only; after the head, POSITION_BLOCK positions at a time (same values)."""
    positions = supervised(row)
    ids = torch.as_tensor(np.asarray(row.input_ids, dtype=np.int64)[positions])
    logits = head(hidden[torch.as_tensor(positions - 1, device=hidden.device)]).float().cpu()
    # every token a top_k cut keeps, and one more for an end of turn min_tokens takes out (on_policy.without_token)
    k, temperature, parts = min(max(top_k, row.point.top_k + 1), logits.shape[-1]), row.point.temperature, []
    for block, block_ids in zip(logits.split(POSITION_BLOCK), ids.split(POSITION_BLOCK), strict=True):
        logp = torch.log_softmax(block, dim=-1)
        top, log_z = torch.topk(logp, k, dim=-1), torch.zeros(len(block))  # log_z: unread when greedy
        if temperature > 0:
            peak = (scaled := logp / temperature).amax(dim=-1, keepdim=True)  # torch.logsumexp's steps, in place
            log_z = scaled.sub_(peak).exp_().sum(dim=-1).log_().add_(peak.squeeze(-1))
        parts.append((logp.gather(1, block_ids[:, None])[:, 0], top.indices, top.values, log_z))
    token_logp, top_ids, top_logp, log_z = (torch.cat(column).numpy() for column in zip(*parts, strict=True))
    return Scored(ids.numpy(), token_logp, top_ids, top_logp, log_z if temperature > 0 else None)


def batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Row positions grouped longest first, each group padding to at most `batch_tokens` tokens (a row
    longer than that alone); deterministic, so a resumed capture shard re-forms the same batches (the
    hidden-state capture batches with it too)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def padded_batches(rows: Sequence[Row], batch_tokens: int = BATCH_TOKENS) -> Iterator[tuple[list[int], Any, Any]]:
    """Each group of `batches` as right-padded `input_ids` and `attention_mask` tensors, with its row positions."""
    import torch

    for group in batches([len(r.input_ids) for r in rows], batch_tokens):
        width = len(rows[group[0]].input_ids)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, i in enumerate(group):
            ids[b, : len(rows[i].input_ids)] = torch.as_tensor(list(rows[i].input_ids))
            mask[b, : len(rows[i].input_ids)] = 1
        yield group, ids, mask


class TransformersScorer:
    """A checkpoint in this process, loaded once (shared with the embedded engine when it is the same)."""

    name = "transformers"

    def __init__(self, checkpoint: str | Path, device: str = "cpu") -> None:
        self.checkpoint = Path(checkpoint).expanduser().resolve()
        if not (self.checkpoint / "config.json").is_file():
            raise ScorerError(
                f"on-policy scorer: no checkpoint at {self.checkpoint}; set [defaults.on_policy] checkpoint to the "
                'target\'s transformers folder, or scorer = "none"'
            )
        self.device, self.batch_tokens = device, 1 if device == "cpu" else BATCH_TOKENS  # demo shard: 14 CPU-s, not 25

    def _load(self) -> tuple[Any, Any]:
        from eagle_data.engines.local import _checkpoint, _fingerprint

        return _checkpoint(self.checkpoint, self.device, _fingerprint(self.checkpoint))

    def check_vocab(self, size: int, eot_id: int) -> None:
        tokenizer, model = self._load()
        rows = model.get_output_embeddings().weight.shape[0]
        if (len(tokenizer) != size and rows != size) or tokenizer.eos_token_id != eot_id:
            raise ScorerError(
                f"on-policy scorer {self.checkpoint}: its vocabulary ({len(tokenizer):,} tokens, {rows:,} head "
                f"rows, end of turn {tokenizer.eos_token_id}) is not the rows' target ({size:,} tokens, end of "
                f"turn {eot_id}): point [defaults.on_policy] checkpoint at the target's own weights"
            )

    def score(self, rows: Sequence[Row], top_k: int) -> list[Scored]:
        import torch

        _, model = self._load()
        base, head = model.get_decoder(), model.get_output_embeddings()
        out: list[Scored | None] = [None] * len(rows)
        for group, ids, mask in padded_batches(rows, self.batch_tokens):
            with torch.inference_mode(), torch_threads():  # a busy core's second thread spins: engines/cpus.py
                hidden = base(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
                for b, i in enumerate(group):
                    out[i] = head_figures(torch, hidden[b], head, rows[i], top_k)
        return [s for s in out if s is not None]


def _post(url: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})  # a POST
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ScorerError(f"on-policy scorer: {what} at {url} answered HTTP {exc.code}: {exc.read()[:200]!r}") from None
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise ScorerError(f"on-policy scorer: {what} at {url} did not answer: {exc}") from None
    if not isinstance(answer, dict):
        raise ScorerError(f"on-policy scorer: {what} at {url} answered {type(answer).__name__}, not a JSON object")
    return answer


def _ignored(what: str, url: str, field: str, asked: str) -> ScorerError:
    return ScorerError(
        f"on-policy scorer: {what} at {url} answered without {field}: it ignores {asked} (not the engine, or a "
        'version without it); point [defaults.on_policy] url at the target\'s server, or scorer = "none"'
    )


def _from_lists(ids: np.ndarray, token_logp: list[float], top: list[list[tuple[float, int]]], size: int) -> Scored:
    """Server answers to arrays: each position's top list sorted (most likely first), padded to one width
    with the last entry (a shorter list only when the vocabulary is smaller than top_k)."""
    width = max(len(t) for t in top)
    top_ids = np.zeros((len(top), width), dtype=np.int64)
    top_logp = np.zeros((len(top), width))
    for p, entries in enumerate(top):
        entries = sorted(entries, key=lambda e: -e[0])
        entries += [entries[-1]] * (width - len(entries))
        top_logp[p], top_ids[p] = zip(*entries, strict=True)
    if size and (top_ids.max(initial=0) >= size):
        raise ScorerError(
            f"on-policy scorer: the server names token id {int(top_ids.max())}, past the rows' target vocabulary "
            f"of {size:,}: it serves another model's vocabulary"
        )
    return Scored(ids, np.asarray(token_logp, dtype=float), top_ids, top_logp)


class SGLangScorer:
    """An SGLang server's native `/generate`: one prefill per row, input log-probabilities from the token
    before the first supervised one (`logprob_start_len`; SGLang gives its first entry no value)."""

    name = "sglang"

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.size = 0

    def check_vocab(self, size: int, eot_id: int) -> None:
        self.size = size  # SGLang reports no vocabulary size: the ids it names are checked on every answer

    def score(self, rows: Sequence[Row], top_k: int) -> list[Scored]:
        return [self._one(row, top_k) for row in rows]

    def _one(self, row: Row, top_k: int) -> Scored:
        positions = supervised(row)
        start = int(positions[0]) - 1
        body = {
            "input_ids": list(map(int, row.input_ids)), "return_logprob": True, "logprob_start_len": start,
            "top_logprobs_num": top_k, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        }  # fmt: skip
        meta = _post(f"{self.url}/generate", body, "sglang").get("meta_info") or {}
        tokens, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
        if not tokens or not tops:
            raise _ignored("sglang", self.url, "meta_info.input_token_logprobs", "return_logprob")
        if len(tokens) != len(row.input_ids) - start:
            raise ScorerError(f"on-policy scorer: sglang at {self.url} gave {len(tokens)} input log-probabilities "
                              f"for {len(row.input_ids) - start} tokens from logprob_start_len {start}")  # fmt: skip
        at = positions - start
        ids = np.asarray(row.input_ids, dtype=np.int64)[positions]
        logp = [tokens[j][0] for j in at]
        top = [[(float(e[0]), int(e[1])) for e in tops[j]] for j in at]
        return _from_lists(ids, logp, top, self.size)


class VLLMScorer:
    """A vLLM server's `/v1/completions` with the row's ids as the prompt and `prompt_logprobs`: each prompt
    position's dict of token id -> {logprob, rank, decoded_token}, the token there and the top k."""

    name = "vllm"

    def __init__(self, url: str, model: str = "") -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.size = 0

    def check_vocab(self, size: int, eot_id: int) -> None:
        self.size = size  # vLLM reports no vocabulary size: the ids it names are checked on every answer
        if not self.model:
            request = urllib.request.Request(f"{self.url}/v1/models")
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                    listed = json.loads(response.read()).get("data") or []
            except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
                raise ScorerError(f"on-policy scorer: vllm at {self.url}/v1/models did not answer: {exc}") from None
            if not listed:
                raise ScorerError(f"on-policy scorer: vllm at {self.url} lists no model: set [defaults.on_policy] "
                                  "model")  # fmt: skip
            self.model = str(listed[0].get("id", ""))

    def score(self, rows: Sequence[Row], top_k: int) -> list[Scored]:
        return [self._one(row, top_k) for row in rows]

    def _one(self, row: Row, top_k: int) -> Scored:
        body = {"model": self.model, "prompt": list(map(int, row.input_ids)), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": top_k}  # fmt: skip
        choices = _post(f"{self.url}/v1/completions", body, "vllm").get("choices") or [{}]
        listed = choices[0].get("prompt_logprobs")
        if not listed or len(listed) != len(row.input_ids):
            raise _ignored("vllm", self.url, "choices[0].prompt_logprobs", "prompt_logprobs")
        positions = supervised(row)
        ids = np.asarray(row.input_ids, dtype=np.int64)[positions]
        logp, top = [], []
        for p, token in zip(positions, ids, strict=True):
            entries = listed[p]
            logp.append(float(entries[str(token)]["logprob"]))
            ranked = [(float(v["logprob"]), int(k)) for k, v in entries.items() if (v.get("rank") or 0) <= top_k]
            top.append(ranked)
        return _from_lists(ids, logp, top, self.size)


@cache
def transformers_scorer(checkpoint: str, device: str = "cpu") -> TransformersScorer:
    """One in-process scorer per checkpoint (its model is loaded once, on first use)."""
    return TransformersScorer(checkpoint, device)


def make_scorer(kind: str, *, checkpoint: str = "", url: str = "", model: str = "") -> Scorer:
    """A scorer of `kind` (transformers, sglang, vllm)."""
    if kind == "transformers":
        return transformers_scorer(checkpoint)
    if not url:
        raise ScorerError(f"on-policy scorer {kind} needs a server: set [defaults.on_policy] url")
    return SGLangScorer(url) if kind == "sglang" else VLLMScorer(url, model)


def resolve_scorer(settings: OnPolicy, frame: pl.DataFrame) -> Scorer | None:
    """The scorer the catalog asks for (None: none). "auto" scores the rows the embedded engine generated, with
    the very checkpoint it generated them with (their `sampling` names it); other engines' rows are left to the
    hidden-state capture unless a scorer is set."""
    if settings.scorer == "none" or not settings.sample_rows:
        return None
    if settings.scorer != "auto":
        return make_scorer(settings.scorer, checkpoint=settings.checkpoint, url=settings.url, model=settings.model)
    if "engine" not in frame.columns or "sampling" not in frame.columns:
        return None
    local = frame.filter(pl.col("engine") == LOCAL_ENGINE)["sampling"].drop_nulls().unique().to_list()
    models = {str(json.loads(s).get("model", "")) for s in local if s.startswith("{")}
    models.discard("")
    return transformers_scorer(sorted(models)[0]) if models else None


def sample(frame: pl.DataFrame, k: int, seed: int = 0) -> list[int]:
    """Positions of the `k` rows kept for training (with supervised tokens) of smallest seeded hash of their
    prompt id: the same rows on every run, spread over the shard."""
    kept = frame.with_row_index("_at").filter(pl.col("verdict").is_in(list(KEPT)) & (pl.col("loss_tokens") > 0))
    pairs = zip(kept["prompt_id"].to_list(), kept["_at"].to_list(), strict=True)
    ranked = sorted(pairs, key=lambda r: rank(seed, r[0]))
    return sorted(at for _, at in ranked[:k])


@dataclass(frozen=True)
class TargetIds:
    """What a scorer is checked against and what places positions: the rows' target's vocabulary size, its
    end-of-turn id (blocked under min_tokens) and its think-marker ids (None when its format has none)."""

    size: int
    eot_id: int
    think: tuple[int, int] | None = None

    @staticmethod
    def of(target: Target | DerivedTarget) -> TargetIds:
        markers = reasoning_markers(target.name)  # a preset's or a checkpoint's own, one accessor
        think = None
        if markers is not None and markers.open_id is not None and markers.close_id is not None:
            think = (markers.open_id, markers.close_id)
        return TargetIds(target.vocab_size, target.eot_id, think)


def figures_for(scored: Scored, row: Row, target: TargetIds, scorer: str) -> dict[str, Any]:
    """One row's on-policy struct from its scored positions: the end of turn taken out where min_tokens blocked
    it, each position placed in its segment."""
    mask = np.array(row.loss_mask, dtype=np.uint8)  # a copy: the row's own may be a read-only view
    mask[:1] = 0
    blocked = reply_index(mask) < row.point.min_tokens
    labels = segments(row.input_ids, mask, target.think)
    return row_figures(without_token(scored, blocked, target.eot_id, row.point), labels, row.point, scorer)


def score_rows(rows: Sequence[Row], scorer: Scorer, target: TargetIds, top_k: int) -> list[dict[str, Any]]:
    """Each row's on-policy struct (ROW_DTYPE); the scorer's vocabulary is checked before its first forward pass
    or request. Rows without a supervised token must be left out by the caller."""
    scorer.check_vocab(target.size, target.eot_id)
    scored = scorer.score(rows, top_k)
    return [figures_for(one, row, target, scorer.name) for row, one in zip(rows, scored, strict=True)]


def on_policy_column(
    frame: pl.DataFrame, settings: OnPolicy, target: TargetIds, default: SamplingPoint, scorer: Scorer | None
) -> pl.Series:
    """The validated frame's `on_policy` column: a sample of `settings.sample_rows` training rows scored by
    `scorer` on their final reply (`on_policy.final_reply`; None on the others, and on every row without a
    scorer)."""
    values: list[dict[str, Any] | None] = [None] * frame.height
    chosen = sample(frame, settings.sample_rows) if scorer is not None else []
    if scorer is not None and chosen:
        columns = ("input_ids", "loss_mask", _or_null(frame, "sampling"), _or_null(frame, "sampling_setting"))
        rows = [
            Row(ids, final_reply(mask), row_sampling(s, setting, default))
            for ids, mask, s, setting in frame[chosen].select(*columns).iter_rows()
        ]
        for at, value in zip(chosen, score_rows(rows, scorer, target, settings.top_logprobs), strict=True):
            values[at] = value
    return pl.Series(COLUMN, values, dtype=ROW_DTYPE)


def _or_null(frame: pl.DataFrame, name: str) -> pl.Expr:
    return pl.col(name) if name in frame.columns else pl.lit(None, pl.String).alias(name)
