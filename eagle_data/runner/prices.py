"""What a token costs, where the replies do not say: a dollar budget is only a budget when something prices the
tokens it counts.

OpenRouter reports each reply's cost in its usage; servers you run (local, SGLang) are paid by the hour, not
the token; plain OpenAI-compatible servers and vLLM report no cost at all, so a dollar budget on them would
count $0 for every reply and never stop anything. For those the price is a setting, `EAGLE_DATA_USD_PER_MTOK`
= "PROMPT,COMPLETION" (USD per million prompt and completion tokens), and without it a dollar budget is
refused before the first request.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle_data import settings
from eagle_data.types import UserError

PRICE_ENV = "EAGLE_DATA_USD_PER_MTOK"


class PriceUnknown(UserError):
    """A dollar budget on an engine whose replies report no cost, with no price set."""


@dataclass(frozen=True)
class Price:
    """USD per prompt token and per completion token."""

    prompt: float
    completion: float

    def of(self, prompt_tokens: int, completion_tokens: int) -> float:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


def configured() -> Price | None:
    """The price `EAGLE_DATA_USD_PER_MTOK` sets, None when it is unset; a one-line error when it is malformed."""
    text = settings.get(PRICE_ENV)
    if not text:
        return None
    try:
        prompt, completion = (float(part) for part in text.split(","))
    except ValueError:
        raise PriceUnknown(
            f"{PRICE_ENV}={text!r} is not two prices: give USD per million prompt and completion tokens, "
            f"e.g. {PRICE_ENV}=0.20,0.80"
        ) from None
    if min(prompt, completion) < 0:
        raise PriceUnknown(f"{PRICE_ENV}={text!r}: prices cannot be negative")
    return Price(prompt / 1e6, completion / 1e6)


def refuse_unpriced(dataset: str, cost_budget_usd: float, billing: str, model: str) -> None:
    """Raise before the first request when a dollar budget meets an engine whose replies report no cost
    (`billing` "unknown", the engine kind's) and no price is set."""
    if cost_budget_usd and billing == "unknown" and configured() is None:
        raise PriceUnknown(
            f"{dataset}: no price for {model or 'the model'}: its server reports no cost, so cost_budget_usd "
            f"(${cost_budget_usd:g}) would count nothing; set {PRICE_ENV}=PROMPT,COMPLETION (USD per million "
            "tokens) or drop cost_budget_usd (0) in the catalog entry"
        )
