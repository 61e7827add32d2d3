"""Per-dataset token and USD budgets (0 = unlimited), counting what is already stored and what is in flight.

A request in flight is counted at its worst case until it lands: its prompt's UTF-8 bytes (no token
holds less than a byte) plus max_tokens, priced at the least upper bound the replies so far give on each
token price. A reply costing `c` for `p` prompt and `k` completion tokens shows the completion price is
at most c/k and the prompt price at most c/p (prices are not negative), so the smallest such ratios
seen bound both. Before any priced reply the price is unknown: with a cost budget, one request at a
time is sent until one lands (a reply reporting no cost, from an engine that reports none, prices tokens
at 0 until a priced one lands). Every request, each turn of a multi-turn conversation included, is sent
only when its worst case fits beside everything in flight, so the spend stays under the budget. A later
turn that cannot fit ends its conversation `skipped_budget`; its paid turns are kept for the next run.
A price set in `EAGLE_DATA_USD_PER_MTOK` (runner/prices.py) prices every token from the start, and what a
reply reporting no cost costs; an engine whose replies report no cost, with no price set, has its dollar
budget refused before the first request (`prices.refuse_unpriced`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle_data.runner.prices import Price
from eagle_data.types import Completion

Hold = tuple[int, float | None]  # a request's worst case while it is out: tokens, USD (None: price unknown)


@dataclass
class Budget:
    dataset: str
    max_tokens: int  # prompt + completion tokens; 0 = unlimited
    max_usd: float  # 0 = unlimited
    tokens: int = 0
    usd: float = 0.0
    held_tokens: int = 0  # the worst case of the requests in flight
    held_usd: float = 0.0
    in_flight: int = 0
    prompt_price: float | None = None  # upper bounds on the USD price of a token, from replies so far
    completion_price: float | None = None
    priced: bool = False  # a reply reported a cost
    price: Price | None = None  # the price set for the model: tokens priced from the start
    limited: bool = field(init=False)  # a token or dollar budget is set

    def __post_init__(self) -> None:
        self.limited = bool(self.max_tokens or self.max_usd)
        if self.price is not None:
            self.prompt_price, self.completion_price = self.price.prompt, self.price.completion

    def cost_of(self, done: Completion) -> float:
        """A reply's dollars: the cost it reported, else its tokens at the price set (0 without one)."""
        if done.cost_usd > 0 or self.price is None:
            return done.cost_usd
        return self.price.of(done.prompt_tokens, done.completion_tokens)

    def spend(self, tokens: int, usd: float) -> None:
        self.tokens += tokens
        self.usd += usd

    def settle(self, done: Completion) -> None:
        """A reply landed: its tokens and dollars spent, and the price bounds tightened by it."""
        self.spend(done.prompt_tokens + done.completion_tokens, self.cost_of(done))
        self.learn(done)

    def learn(self, done: Completion) -> None:
        """Tighten the price bounds with one reply. A reply with no cost, before any priced one, is an
        engine that reports none (local, SGLang): its requests cost the price set (nothing without one)
        until a priced reply says otherwise; what replies report wins over the price set."""
        if done.cost_usd <= 0:
            if not self.priced:
                self.prompt_price = self.price.prompt if self.price else 0.0
                self.completion_price = self.price.completion if self.price else 0.0
            return
        if not self.priced:
            self.priced, self.prompt_price, self.completion_price = True, None, None
        if done.completion_tokens > 0:
            bound = done.cost_usd / done.completion_tokens
            self.completion_price = bound if self.completion_price is None else min(self.completion_price, bound)
        if done.prompt_tokens > 0:
            bound = done.cost_usd / done.prompt_tokens
            self.prompt_price = bound if self.prompt_price is None else min(self.prompt_price, bound)

    def worst(self, prompt_bytes: int, max_tokens: int) -> tuple[int, float | None]:
        """(tokens, USD) a request may cost at most; USD None while no price is known."""
        if self.completion_price is None or self.prompt_price is None:
            return prompt_bytes + max_tokens, None
        return prompt_bytes + max_tokens, prompt_bytes * self.prompt_price + max_tokens * self.completion_price

    def take(self, prompt_bytes: int, max_tokens: int) -> Hold | None:
        """Hold a request's worst case when it fits beside everything in flight; None when it does not (yet)."""
        worst = self.worst(prompt_bytes, max_tokens)
        if not self.fits(*worst):
            return None
        self.hold(*worst)
        return worst

    def hold_worst(self, prompt_bytes: int, max_tokens: int) -> Hold:
        """Hold a request's worst case whether or not it fits (a retry of a request admitted already)."""
        worst = self.worst(prompt_bytes, max_tokens)
        self.hold(*worst)
        return worst

    def hold(self, tokens: int, usd: float | None) -> None:
        self.held_tokens += tokens
        self.held_usd += usd or 0.0
        self.in_flight += 1

    def release(self, tokens: int, usd: float | None) -> None:
        self.held_tokens -= tokens
        self.held_usd -= usd or 0.0
        self.in_flight -= 1

    def fits(self, tokens: int, usd: float | None) -> bool:
        """Would a request of this worst case, beside everything in flight, stay within the budget?"""
        if self.max_tokens and self.tokens + self.held_tokens + tokens > self.max_tokens:
            return False
        if self.max_usd and usd is None:  # price unknown: one request at a time finds it
            return self.in_flight == 0 and self.usd < self.max_usd
        return not self.max_usd or self.usd + self.held_usd + (usd or 0.0) <= self.max_usd

    def reason(self, prompt_bytes: int, max_tokens: int) -> str:
        """Why no more requests are sent: nothing is in flight and one more such request does not fit."""
        tokens, usd = self.worst(prompt_bytes, max_tokens)
        if self.max_tokens and self.tokens + tokens > self.max_tokens:
            return (
                f"{self.dataset}: token budget reached ({self.tokens:,} of {self.max_tokens:,} tokens; "
                f"one more request may take {tokens:,}); raise token_budget in catalog.toml and re-run to continue"
            )
        return (
            f"{self.dataset}: cost budget reached (${self.usd:.2f} of ${self.max_usd:.2f}; one more request may "
            f"cost ${usd or 0.0:.4f}); raise cost_budget_usd in catalog.toml and re-run to continue"
        )
