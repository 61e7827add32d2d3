"""The OpenAI chat protocol as pure functions: one HTTP answer to a Completion or to the typed error it stands for.

The hot path stays on bare aiohttp (eagle_data/engines/openai_compat.py); these functions sort what came
back, by exception class: `RetryableError` (rate limits with their Retry-After, 5xx, errors inside a 200
body: OpenRouter reports a failure after generation started as HTTP 200 with an `error` object),
`AbortError` (a refused key, no budget, an unknown model: every later request would fail too) and
`FatalError` (this request cannot succeed). Tested on their own, without a server.
"""

from __future__ import annotations

import json
import time
from typing import Any

from eagle_data.engines.replies import reply_text
from eagle_data.quality import sampled
from eagle_data.retry_after import parse_retry_after
from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers
from eagle_data.types import AbortError, Completion, ConfigError, FatalError, RetryableError, SampledLogprobs

RETRY_STATUSES = frozenset({408, 409, 425, 429})
THROTTLE_STATUSES = frozenset({429, 503})
ABORT_STATUSES = frozenset({401, 403, 404})  # a refused key, no access, no such model: the same for every prompt
IN_FLIGHT_REASON = "in_flight_budget_exhausted"
ERROR_TEXT_CHARS = 300


def _server_error(body: bytes) -> tuple[str, dict[str, Any]]:
    """(message, metadata) from an error body `{error: {code, message, metadata}}`, or its raw text."""
    try:
        err = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return body[:ERROR_TEXT_CHARS].decode(errors="replace"), {}
    if not isinstance(err, dict):
        return str(err)[:ERROR_TEXT_CHARS], {}
    message = str(err.get("message") or err.get("code") or "no message")[:ERROR_TEXT_CHARS]
    return message, err.get("metadata") or {}


def http_error(status: int, body: bytes, retry_after: str | None, now: float) -> RetryableError | FatalError:
    """Sort a non-200 answer into retryable (with kind, Retry-After, throttle), run-stopping or fatal."""
    message, metadata = _server_error(body)
    wait = parse_retry_after(retry_after, now)
    text = f"HTTP {status}: {message}"
    if status == 402:
        reason = str(metadata.get("reason", "")) if isinstance(metadata, dict) else ""
        if reason == IN_FLIGHT_REASON or IN_FLIGHT_REASON in message:
            return RetryableError(text, kind="http_402_in_flight", retry_after=wait, throttle=True)
        return AbortError(f"{text} (add credits or raise the key's limit)", kind="http_402_budget")
    if status in RETRY_STATUSES or status >= 500:
        # A 503 without Retry-After is an ordinary failure: random 5xx must not collapse the in-flight limit.
        throttle = status == 429 or (status in THROTTLE_STATUSES and wait is not None)
        return RetryableError(text, kind=f"http_{status}", retry_after=wait, throttle=throttle)
    if status in ABORT_STATUSES:
        return AbortError(text, kind=f"http_{status}")
    if 400 <= status < 500:
        return FatalError(text, kind=f"http_{status}")
    return RetryableError(text, kind=f"http_{status}", retry_after=wait)


def parse_response(
    status: int,
    body: bytes,
    retry_after: str | None = None,
    now: float = 0.0,
    markers: ReasoningMarkers | None = THINK_TAGS,
    token_ids: bool = False,
    top_logprobs: int = 0,
) -> Completion:
    """A Completion from one HTTP answer, or the error it stands for (200 bodies are checked too); `markers`:
    the target's think-block markers, for a think block left inside `content`. Token ids are kept whenever
    the answer has them (vLLM's `token_ids` per choice, `prompt_token_ids`); `token_ids`: they were asked
    for, so an answer without them is a one-line fatal error (the server ignores the request field).
    `top_logprobs` > 0: the sampled tokens' log-probabilities were asked for with that many most likely tokens
    each (`choices[0].logprobs`); an answer without them is a one-line fatal error too."""
    if status != 200:
        raise http_error(status, body, retry_after, now or time.time())
    try:
        data = json.loads(body)
    except ValueError:
        raise RetryableError(f"unreadable JSON body: {body[:ERROR_TEXT_CHARS]!r}", kind="bad_json") from None
    if data.get("error"):
        message, _ = _server_error(body)
        raise RetryableError(f"error inside a 200 body: {message}", kind="body_error")
    choices = data.get("choices") or []
    if not choices:
        raise RetryableError("200 body without choices", kind="empty_choices")
    choice = choices[0]
    finish = choice.get("finish_reason") or ""
    if finish == "error":
        raise RetryableError("generation failed mid-way (finish_reason=error)", kind="finish_error")
    reasoning, content = reply_text(choice.get("message") or {}, markers)
    output_ids, prompt_ids = _ids(choice.get("token_ids")), _ids(data.get("prompt_token_ids"))
    if token_ids and output_ids is None:
        raise ConfigError(
            "the server answered without token_ids: it ignores return_token_ids (vLLM's OpenAI server takes it); "
            "upgrade vLLM, or use EAGLE_DATA_ENGINE=openai to run without token ids"
        )
    figures = _asked_figures(choice.get("logprobs"), top_logprobs) if top_logprobs else None
    usage = data.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    return Completion(
        content=content,
        reasoning=reasoning,
        finish_reason=finish,
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=usage.get("completion_tokens") or 0,
        reasoning_tokens=details.get("reasoning_tokens") or 0,
        cost_usd=float(usage.get("cost") or 0.0),
        provider=data.get("provider") or "",
        served_model=data.get("model") or "",
        output_ids=output_ids,
        prompt_ids=prompt_ids,
        sampled_logprobs=figures,
    )


def _asked_figures(logprobs: Any, k: int) -> SampledLogprobs:
    """The figures of a choice's `logprobs` that were asked for, or a one-line error naming the setting."""
    if (figures := sampled_figures(logprobs, k)) is None:
        raise ConfigError(
            "the server answered without logprobs: it ignores the chat request's logprobs and top_logprobs (vLLM "
            "and SGLang take them; on OpenRouter route to providers that do: provider.require_parameters); or set "
            "[defaults.on_policy] sampled_logprobs = false"
        )
    return figures


def sampled_figures(logprobs: Any, k: int) -> SampledLogprobs | None:
    """A choice's `logprobs` (OpenAI's chat format: `content`, one `{token, logprob, bytes, top_logprobs: [{token,
    logprob, bytes}]}` per sampled token) as the reply's figures; None when it has no `content` list. A token without
    a value (vLLM's -9999.0 placeholder) is left out."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    values, ranks = [], []
    for entry in content:
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(value, int | float) or value <= sampled.NO_VALUE:
            continue
        listed = [t["logprob"] for t in entry.get("top_logprobs") or () if isinstance(t, dict) and "logprob" in t]
        values.append(float(value))
        ranks.append(sampled.rank_of(value, listed, k))
    return sampled.figures(values, ranks, k)


def _ids(value: Any) -> list[int] | None:
    """A list of token ids from an answer field, or None when the field is missing or not such a list."""
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        return None
    return value


def served_ids(status: int, body: bytes) -> list[str]:
    """The model ids an OpenAI-style `GET /models` answer lists (`{data: [{id}]}`); [] for any other answer."""
    if status != 200:
        return []
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return []
    if not isinstance(data, list):
        return []
    return [str(entry["id"]) for entry in data if isinstance(entry, dict) and entry.get("id")]
