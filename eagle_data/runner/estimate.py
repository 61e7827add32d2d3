"""Pre-flight estimate: tokens and dollars a dataset will take, shown before anything is spent.

Prompt tokens are counted with the real tokenizer over the turns that will be sent (each turn
re-sends the conversation so far, with earlier replies at the sample's average length); completion
tokens are projected from a small sample run. Dollars come from the price given (the estimate's run
config, else `EAGLE_DATA_USD_PER_MTOK`), else from what the sampled replies reported they cost (their
dollars per token); when neither says, the dollars are unknown, and a cost budget cannot pass on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from eagle_data.catalog import DatasetSpec
from eagle_data.runner import prices
from eagle_data.runner.rows import plan_turns

TEMPLATE_TOKENS_PER_MESSAGE = 4  # chat-template framing per message (role markers, separators)


@dataclass(frozen=True)
class Estimate:
    dataset: str
    prompts: int
    turns: int
    prompt_tokens: int
    completion_tokens: int
    usd: float | None  # None: no price given and the sampled replies reported no cost
    avg_completion_tokens: float  # per reply, from the sample
    sample_rows: int
    token_budget: int
    cost_budget_usd: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def line(self) -> str:
        fits = []
        if self.token_budget:
            fits.append(f"{self.tokens / self.token_budget:.0%} of the token budget")
        if self.cost_budget_usd and self.usd is not None:
            fits.append(f"{self.usd / self.cost_budget_usd:.0%} of the cost budget")
        head = f"{self.dataset}: {self.prompts} prompts, {self.turns} replies"
        tokens = (
            f"~{self.prompt_tokens / 1e6:.2f}M prompt + ~{self.completion_tokens / 1e6:.2f}M completion "
            f"tokens "
            f"(avg_comp={self.avg_completion_tokens:.0f}tok from {self.sample_rows} sampled rows)"
        )
        dollars = dollars_line(self.usd)
        return f"{head}, {tokens}, {dollars}" + (f"; {', '.join(fits)}" if fits else "")

    def over_budget(self) -> str:
        """Why the projection does not fit the dataset's budgets, or "" when it fits (0 = unlimited)."""
        if self.token_budget and self.tokens > self.token_budget:
            return (
                f"{self.dataset}: projected {self.tokens:,} tokens exceed token_budget {self.token_budget:,}; "
                "raise token_budget in the catalog (or lower max_prompts) and re-run"
            )
        if self.cost_budget_usd and self.usd is None:
            return (
                f"{self.dataset}: cost_budget_usd ${self.cost_budget_usd:.2f} cannot be checked: the sampled replies "
                f"reported no cost and no price is set; set {prices.PRICE_ENV}=PROMPT,COMPLETION (USD per million "
                "tokens) or the estimate's usd_per_million_* run config, or drop cost_budget_usd"
            )
        if self.cost_budget_usd and self.usd is not None and self.usd > self.cost_budget_usd:
            return (
                f"{self.dataset}: projected ${self.usd:.2f} exceeds cost_budget_usd ${self.cost_budget_usd:.2f}; "
                "raise cost_budget_usd in the catalog (or lower max_prompts) and re-run"
            )
        return ""

    def cost_figures(self) -> dict[str, Any]:
        """`est_cost_usd`, left out when the dollars are unknown (never a made-up $0)."""
        return {} if self.usd is None else {"est_cost_usd": round(self.usd, 4)}

    def figures(self) -> dict[str, Any]:
        return {
            "est_prompts": self.prompts,
            "est_turns": self.turns,
            "est_prompt_tokens": self.prompt_tokens,
            "est_completion_tokens": self.completion_tokens,
            "est_tokens": self.tokens,
            **self.cost_figures(),
            "est_avg_comp": round(self.avg_completion_tokens, 1),
            "est_sample_rows": self.sample_rows,
            "token_budget": self.token_budget,
            "cost_budget_usd": self.cost_budget_usd,
        }


def dollars_line(usd: float | None) -> str:
    """Dollars as a person reads them: cents from a cent up, two significant digits below (never "~$0.00"
    for a real $0.0007), and "unknown" where nothing priced them."""
    if usd is None:
        return "dollars unknown (no price)"
    return f"~${usd:,.2f}" if usd >= 0.01 or usd == 0 else f"~${usd:.2g}"


def sample_avg_completion(sample: pl.DataFrame) -> float:
    """Completion tokens per reply in a generations frame (ok and truncated rows)."""
    answered = sample.filter(pl.col("status").is_in(["ok", "truncated"]))
    replies = answered.select(
        pl.col("messages").list.eval(pl.element().struct.field("role") == "assistant").list.sum().sum()
    ).item()
    if not replies:
        raise ValueError("the sample has no answered rows: run a small sample generation first")
    return float(answered["completion_tokens"].sum()) / replies


def estimate_generation(
    blocks: Iterable[pl.DataFrame],
    spec: DatasetSpec,
    count_tokens: Callable[[list[str]], list[int]],
    sample: pl.DataFrame,
    usd_per_prompt_token: float,
    usd_per_completion_token: float,
) -> Estimate:
    """Project tokens and dollars for the prompts in `blocks` (prompts frames, read one at a time so a
    million prompts never sit in memory together) under `spec`'s turn policy. `count_tokens` counts a
    batch of texts at once (a batch encode is many times faster than one text at a time). Prices of 0
    mean none was given (see `_dollars`)."""
    avg = sample_avg_completion(sample)
    prompts = turns = prompt_tokens = 0
    for block in blocks:
        plans = [plan_turns(messages, spec.regenerate, spec.max_turns) for messages in block["messages"].to_list()]
        texts = list({m["content"]: None for segments in plans for segment in segments for m in segment})
        tokens = dict(zip(texts, count_tokens(texts), strict=True))
        for segments in plans:
            context = 0
            for k, segment in enumerate(segments):
                context += sum(tokens[m["content"]] + TEMPLATE_TOKENS_PER_MESSAGE for m in segment)
                prompt_tokens += context + round(k * (avg + TEMPLATE_TOKENS_PER_MESSAGE))
                turns += 1
        prompts += block.height
    completion_tokens = round(turns * avg)
    return Estimate(
        dataset=spec.name,
        prompts=prompts,
        turns=turns,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        usd=_dollars(sample, prompt_tokens, completion_tokens, usd_per_prompt_token, usd_per_completion_token),
        avg_completion_tokens=avg,
        sample_rows=sample.height,
        token_budget=spec.token_budget,
        cost_budget_usd=spec.cost_budget_usd,
    )


def _dollars(
    sample: pl.DataFrame, prompt_tokens: int, completion_tokens: int, usd_prompt: float, usd_completion: float
) -> float | None:
    """The projection's dollars: at the prices given, else at `EAGLE_DATA_USD_PER_MTOK`, else at the dollars per
    token the sampled replies reported; None when none of them says."""
    given = prices.Price(usd_prompt, usd_completion) if usd_prompt or usd_completion else prices.configured()
    if given is not None:
        return given.of(prompt_tokens, completion_tokens)
    answered = sample.filter(pl.col("status").is_in(["ok", "truncated"]))
    reported = float(answered["cost_usd"].sum())
    sampled = int(answered["prompt_tokens"].sum() + answered["completion_tokens"].sum())
    if reported <= 0 or not sampled:
        return None
    return reported / sampled * (prompt_tokens + completion_tokens)
