"""Result types, the engine interface and the retryable/fatal error split shared by every room.

Kept tiny and dependency-free on purpose: engines, the runner, targets and the Dagster layer all
import from here, and nothing here imports them back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self, TypedDict

Role = Literal["system", "user", "assistant"]
PROMPT_ID_HEADER = "X-Eagle-Prompt-Id"  # sent with every request (a content hash, no text): servers can log per prompt
Status = Literal["ok", "truncated", "failed", "skipped_budget"]


class Message(TypedDict, total=False):
    """One chat turn. `reasoning` is set only on regenerated assistant turns."""

    role: Role
    content: str
    reasoning: str
    output_ids: list[int]  # the model's own tokens for this turn, when the engine returns them


class SampledLogprobs(TypedDict):
    """The sampled tokens' own log-probabilities, reported by the engine with its reply (eagle_data/quality/sampled.py):
    the tokens that carry one, their sum, and `ranks[r]` the tokens at rank r among the k most likely listed (the
    last: rank k - 1 or beyond)."""

    tokens: int
    logprob: float
    ranks: list[int]


@dataclass(frozen=True)
class Completion:
    """One engine reply to one conversation prefix (the next assistant turn)."""

    content: str
    reasoning: str = ""
    finish_reason: str = "stop"  # "stop" | "length" | engine-specific
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    provider: str = ""
    served_model: str = ""  # the model id the server reports serving (OpenAI-style `model`), "" if none
    output_ids: list[int] | None = None  # the model's own tokens, when the engine returns them
    prompt_ids: list[int] | None = None  # the prompt's tokens as the server rendered them, when it returns them
    sampled_logprobs: SampledLogprobs | None = None  # where the engine was asked for them and returned them

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def empty(self) -> bool:
        """No text at all (content and reasoning blank): a failed attempt, never a result."""
        return not self.content.strip() and not self.reasoning.strip()


class UserError(Exception):
    """An error the person running the job caused or can fix (a setting, a file, a server, a lease): its
    message is one line naming what and what to do, and Dagster shows only that line (defs/messages.py).
    Every such exception of the pure rooms derives from this class where it is defined. Line breaks in the
    message (a server's own text often has them) become spaces."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.splitlines()))


class EngineError(UserError):
    """An engine call failed. The class says what the runner does with it (retry, give up on the prompt, stop
    sending); `kind` is the short label it is counted under (`errors_by_kind`, "first http_429 error: ..."):
    each class names its own, and an instance may give a finer one (the HTTP status, the shape of a bad body)."""

    kind = "error"

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        if kind:
            self.kind = kind

    def restated(self, message: str) -> Self:
        """The same error (class, kind) with another line, e.g. the runner's stop line naming the dataset."""
        again = copy.copy(self)
        again.args = (" ".join(message.splitlines()),)
        return again


class RetryableError(EngineError):
    """Worth another attempt: rate limits, 5xx, timeouts, resets, errors inside a 200 body."""

    def __init__(
        self, message: str, *, kind: str | None = None, retry_after: float | None = None, throttle: bool = False
    ) -> None:
        super().__init__(message, kind=kind)
        self.retry_after = retry_after
        self.throttle = throttle  # the server asked us to slow down (429/503/402-in-flight)


class FatalError(EngineError):
    """Retrying cannot help this request (a bad request, a reply that cannot be stored)."""


class Unreachable(FatalError):
    """Before any prompt: the server (or its key endpoint) cannot be reached or does not answer."""

    kind = "unreachable"


class AbortError(FatalError):
    """Every later request would fail the same way (a missing or refused key, no budget left, a model or
    setting the server does not take): the runner stops sending, keeps what landed, and fails with this line."""


class ConfigError(AbortError):
    """A setting is wrong or missing."""

    kind = "config"


class SamplingRefused(ConfigError):
    """A per-request sampling setting (a catalog sampling mixture) given to an engine that cannot honour it."""

    def __init__(self, engine: str, dataset: str = "") -> None:
        super().__init__(
            f"{dataset + ': ' if dataset else ''}engine {engine} takes no per-request sampling settings; remove the "
            "catalog entry's generation.mixture or use an OpenAI-compatible engine (openai, openrouter, vllm)"
        )


class KeyMissing(AbortError):
    """The variable that should hold the API key is empty."""

    kind = "auth_missing"


class Sampling(Protocol):
    """One prompt's sampling setting (a catalog mixture's `SamplingSetting`), sent in place of the engine's
    own; a field left None keeps the engine's setting."""

    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def min_p(self) -> float | None: ...
    @property
    def reasoning_effort(self) -> str | None: ...
    @property
    def thinking(self) -> bool | None: ...


class Engine(Protocol):
    """A generation backend: send a conversation, get the next assistant turn back.

    Engines subclass this protocol explicitly, so the optional hooks (`stats`, `stats_line`,
    `describe`) have their no-op defaults.
    """

    name: str  # the engine kind's registry name
    model: str
    takes_sampling: bool = False  # `complete` honours a per-request `sampling` (catalog sampling mixtures)
    reports_prompt_ids: bool = False  # its completions carry the prompt ids the server rendered (`prompt_ids`)

    def config(self) -> dict[str, Any]:
        """Everything that changes the output (model, sampling, max tokens, reasoning, routing).

        Hashed into `config_hash`, the resume key: never put secrets here.
        """
        ...

    async def check(self) -> str:
        """Before any prompt is sent: one line on what will serve (credit left, servers up), or a
        one-line FatalError saying what to fix (server unreachable, wrong model, no key, no credit)."""
        ...

    async def complete(
        self, messages: list[Message], *, prompt_id: str, sampling: Sampling | None = None
    ) -> Completion:
        """The next assistant turn. `sampling`: this prompt's setting, only for an engine that `takes_sampling`
        (one that does not raises a FatalError when given one)."""
        ...

    async def served_prompt_ids(self, messages: list[Message]) -> list[int]:
        """The prompt ids the server renders for `messages`, from one request for a one-token reply: the
        pre-flight's look at the server's chat template (only called on an engine that `reports_prompt_ids`)."""
        raise NotImplementedError(f"engine {self.name} does not report prompt ids")

    async def aclose(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        """The engine's own figures for Dagster metadata (e.g. per SGLang server); {} when it has none."""
        return {}

    def stats_line(self) -> str:
        """`stats()` as one progress-line fragment, with the same names; "" when it has none."""
        return ""

    def describe(self) -> str:
        """What serves, in a few words, for logs and metadata (e.g. `local (demo model, random weights)`)."""
        return f"{self.name} {self.model}"


def encodable(text: str) -> bool:
    """Whether `text` can be stored: JSON may carry lone surrogates (`"\\ud800"`) that UTF-8, and so Parquet
    and every text file, refuses."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
