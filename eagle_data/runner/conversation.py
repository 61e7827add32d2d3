"""One prompt's walk through its user turns: the turns a result log already holds replayed first, then this
run's replies, and the row it ends as."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from eagle_data.runner.budget import Hold
from eagle_data.runner.resultlog import Turn, completion_of
from eagle_data.runner.rows import Row, assistant_message, build_row
from eagle_data.types import Completion, Message, Status


@dataclass
class Conversation:
    """One prompt's walk through its user turns: stored turns replayed first, then this run's."""

    prompt_id: str
    segments: list[list[Message]]
    turns: list[Turn] = field(default_factory=list)  # the records of every reply so far
    messages: list[Message] = field(default_factory=list)
    replies: list[Completion] = field(default_factory=list)
    attempts: int = 0
    latency_s: float = 0.0
    held: Hold | None = None  # the budget held for its first request at admission

    def add(self, done: Completion, turn: Turn) -> None:
        self.messages.extend(self.segments[len(self.replies)])
        self.replies.append(done)
        self.messages.append(assistant_message(done))
        self.turns.append(turn)
        self.attempts += turn["attempts"]
        self.latency_s += turn["latency_s"]

    def replay(self, stored: list[Turn]) -> None:
        for turn in stored[: len(self.segments)]:
            if self.ended:
                break
            self.add(completion_of(turn), turn)

    @property
    def ended(self) -> bool:
        """Every turn answered, or the last one hit max_tokens (the conversation stops there)."""
        return bool(self.replies) and (len(self.replies) == len(self.segments) or self.replies[-1].truncated)

    def row(self, status: Status, error: str, finished_at: float | None = None) -> Row:
        status = "truncated" if status == "ok" and self.replies and self.replies[-1].truncated else status
        return build_row(
            self.prompt_id,
            status,
            self.messages,
            self.replies,
            attempts=self.attempts,
            latency_s=self.latency_s,
            error=error,
            finished_at=time.time() if finished_at is None else finished_at,
        )
