"""Per-dataset token and USD budgets (0 = unlimited), counting what is already stored."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Budget:
    dataset: str
    max_tokens: int  # prompt + completion tokens; 0 = unlimited
    max_usd: float  # 0 = unlimited
    tokens: int = 0
    usd: float = 0.0

    def spend(self, tokens: int, usd: float) -> None:
        self.tokens += tokens
        self.usd += usd

    def exhausted(self) -> str:
        """Why no more requests may be sent, or "" while within budget."""
        if self.max_tokens and self.tokens >= self.max_tokens:
            return (
                f"{self.dataset}: token budget reached ({self.tokens:,} of {self.max_tokens:,} tokens); "
                "raise token_budget in catalog.toml and re-run to continue"
            )
        if self.max_usd and self.usd >= self.max_usd:
            return (
                f"{self.dataset}: cost budget reached (${self.usd:.2f} of ${self.max_usd:.2f}); "
                "raise cost_budget_usd in catalog.toml and re-run to continue"
            )
        return ""
