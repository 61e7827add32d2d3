"""OpenAI-compatible chat engine (OpenRouter, vLLM, SGLang's /v1, `transformers serve`) on bare aiohttp.

The hot path is one shared aiohttp session with a pool sized for thousands of requests in flight:
the openai SDK costs 3-6x more CPU per request (measured on 2 cores), which at 2,000 in flight makes the client
the bottleneck. Response parsing and error sorting are pure functions (`parse_response`), tested on
their own. The API key is read from an environment variable when the session opens; it is never in
`config()`, logs, or files, and server error text is redacted of it before it becomes an error.
Registers two kinds: `openai` (any OpenAI-compatible server) and `openrouter`.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from eagle_data import settings
from eagle_data.engines import EngineKind, EngineSettings, lookup, register
from eagle_data.engines.replies import reply_text
from eagle_data.engines.served import ModelMismatchError, model_matches
from eagle_data.retry_after import parse_retry_after
from eagle_data.secrets import mask_url, redact, strip_credentials, url_parts
from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers, reasoning_markers
from eagle_data.types import (
    PROMPT_ID_HEADER,
    Completion,
    Engine,
    EngineError,
    FatalError,
    Message,
    RetryableError,
    Sampling,
)

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec

OPENAI, OPENROUTER = "openai", "openrouter"
OPENROUTER_URL = "https://openrouter.ai/api/v1"
OPENROUTER_KEY_ENV = "OPENROUTER_API_KEY"
PROVIDER_KEYS = frozenset({
    "order", "only", "ignore", "quantizations", "allow_fallbacks", "sort", "require_parameters",
    "data_collection", "max_price", "enforce_distillable_text",
})  # fmt: skip
REASONING_KEYS = frozenset({"effort", "max_tokens", "exclude", "enabled"})
RETRY_STATUSES = frozenset({408, 409, 425, 429})
THROTTLE_STATUSES = frozenset({429, 503})
IN_FLIGHT_REASON = "in_flight_budget_exhausted"
ERROR_TEXT_CHARS = 300
TIMEOUT_S = 600.0  # whole-request timeout: a long reasoning reply can take minutes
CONNECT_TIMEOUT_S = 10.0  # a dead host fails fast
CHECK_TIMEOUT_S = 30.0
SHOWN_IDS = 3  # served ids a mismatch error names
TEMPLATE_PROBE_ID = "template-check"  # the prompt id the pre-flight's request carries


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
    """Sort a non-200 answer into retryable (with kind, Retry-After, throttle) or fatal."""
    message, metadata = _server_error(body)
    wait = parse_retry_after(retry_after, now)
    text = f"HTTP {status}: {message}"
    if status == 402:
        reason = str(metadata.get("reason", "")) if isinstance(metadata, dict) else ""
        if reason == IN_FLIGHT_REASON or IN_FLIGHT_REASON in message:
            return RetryableError(text, kind="http_402_in_flight", retry_after=wait, throttle=True)
        return FatalError(f"{text} (add credits or raise the key's limit)", kind="http_402_budget")
    if status in RETRY_STATUSES or status >= 500:
        # A 503 without Retry-After is an ordinary failure: random 5xx must not collapse the in-flight limit.
        throttle = status == 429 or (status in THROTTLE_STATUSES and wait is not None)
        return RetryableError(text, kind=f"http_{status}", retry_after=wait, throttle=throttle)
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
) -> Completion:
    """A Completion from one HTTP answer, or the error it stands for (200 bodies are checked too); `markers`:
    the target's think-block markers, for a think block left inside `content`. Token ids are kept whenever
    the answer has them (vLLM's `token_ids` per choice, `prompt_token_ids`); `token_ids`: they were asked
    for, so an answer without them is a one-line fatal error (the server ignores the request field)."""
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
        raise FatalError(
            "the server answered without token_ids: it ignores return_token_ids (vLLM's OpenAI server takes it); "
            "upgrade vLLM, or use EAGLE_DATA_ENGINE=openai to run without token ids",
            kind="config",  # the server is not what the kind needs: stop sending, like any configuration error
        )
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
    )


def _ids(value: Any) -> list[int] | None:
    """A list of token ids from an answer field, or None when the field is missing or not such a list."""
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        return None
    return value


def _checked(name: str, value: dict[str, Any] | None, allowed: frozenset[str]) -> dict[str, Any] | None:
    unknown = set(value or {}) - allowed
    if unknown:
        raise ValueError(f"{name}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    return dict(value) if value else None


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


def checked_base_url(base_url: str) -> str:
    """`base_url` if it is an absolute http(s) URL with a host, else a one-line config error."""
    if url_parts(base_url) is None:
        raise FatalError(
            f"base URL {mask_url(base_url)!r} is not an http(s) URL with a host: set EAGLE_DATA_BASE_URL "
            "(e.g. http://host:30000/v1)",
            kind="config",
        )
    return base_url.strip()


class OpenAICompatEngine(Engine):
    """POST {base_url}/chat/completions; one aiohttp session per event loop, opened lazily.

    Credentials in the base URL (`http://user:pass@host/v1`) are sent as basic auth instead of a key.
    """

    takes_sampling = True

    def __init__(
        self,
        *,
        model: str,
        base_url: str = OPENROUTER_URL,
        name: str = "openai",
        api_key_env: str | None = None,
        max_tokens: int = 4096,
        temperature: float = 0.7,
        top_p: float = 0.95,
        thinking: bool | None = None,
        reasoning: dict[str, Any] | None = None,
        provider: dict[str, Any] | None = None,
        extra_body: dict[str, Any] | None = None,
        timeout_s: float = TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        max_connections: int = 4096,
        reasoning_request: bool = False,
        reports_credit: bool = False,
        checks_model: bool = True,
        markers: ReasoningMarkers | None = THINK_TAGS,
        token_ids: bool = False,
    ) -> None:
        """`reasoning_request`: the API takes OpenRouter's `reasoning` request field, so the thinking
        switch goes there (else into `chat_template_kwargs`); `reports_credit`: it answers GET /key with
        the key's credit, checked before anything is sent; `checks_model`: GET /models lists every model
        the server serves, so a model missing from a non-empty list is refused before anything is sent;
        `markers`: the target's think-block markers (None: its format has none), for replies that leave a
        think block inside `content`; `token_ids`: ask for the reply's and the prompt's token ids (vLLM's
        `return_token_ids`) and refuse an answer without them."""
        self.name, self.model, self.markers = name, model, markers
        self.reasoning_request, self.reports_credit, self.checks_model = reasoning_request, reports_credit, checks_model
        base, user, password = strip_credentials(checked_base_url(base_url))
        self.base = base.rstrip("/")
        self.url = self.base + "/chat/completions"
        self.shown = mask_url(base_url.strip().rstrip("/"))  # the base URL as logs and errors show it
        self._basic = aiohttp.encode_basic_auth(user, password) if user or password else None
        self._url_secret = password
        self.api_key_env = api_key_env
        self.timeout_s, self.connect_timeout_s, self.max_connections = timeout_s, connect_timeout_s, max_connections
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
        }
        if provider := _checked("provider", provider, PROVIDER_KEYS):
            body["provider"] = provider
        if reasoning := _checked("reasoning", reasoning, REASONING_KEYS):
            body["reasoning"] = reasoning
        elif thinking is not None and reasoning_request:
            body["reasoning"] = {"enabled": thinking}
        elif thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
        if token_ids:
            body["return_token_ids"] = True
        body.update(extra_body or {})
        self._body, self.token_ids, self.reports_prompt_ids = body, token_ids, token_ids
        self._session: aiohttp.ClientSession | None = None

    def config(self) -> dict[str, Any]:
        """Everything that changes the output (no URL, timeout or key)."""
        return {"engine": self.name, **self._body}

    def describe(self) -> str:
        return f"{self.name} {self.model} at {self.shown}"

    def _auth(self) -> dict[str, str]:
        """The Authorization header (basic auth from the URL, or the key); a one-line error when the key
        is needed and unset."""
        key = settings.get(self.api_key_env) if self.api_key_env else ""
        if self._basic is not None:
            if key:
                raise FatalError(
                    f"the base URL {self.shown} carries credentials and {self.api_key_env} holds an API key: "
                    "keep one (drop the user:password from EAGLE_DATA_BASE_URL, or unset the key)",
                    kind="config",
                )
            return {"Authorization": self._basic}
        if self.api_key_env and not key:
            raise FatalError(f"environment variable {self.api_key_env} is empty: export the API key",
                             kind="auth_missing")  # fmt: skip
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _secrets(self) -> list[str]:
        key = settings.get(self.api_key_env) if self.api_key_env else ""
        return [key, self._url_secret, (self._basic or "").removeprefix("Basic ")]

    def _scrubbed(self, exc: EngineError) -> EngineError:
        """`exc` with the key and URL password taken out of its message (servers may echo them)."""
        exc.args = (redact(str(exc), self._secrets()),)
        return exc

    def _timeout(self, total_s: float) -> aiohttp.ClientTimeout:
        """`total_s` bounds the whole request, answer included: a server dripping bytes cannot stretch it."""
        return aiohttp.ClientTimeout(total=total_s, sock_connect=self.connect_timeout_s)

    def _open(self) -> aiohttp.ClientSession:
        headers = {"Content-Type": "application/json", **self._auth()}
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300)
        return aiohttp.ClientSession(connector=connector, headers=headers, timeout=self._timeout(self.timeout_s))

    async def check(self) -> str:
        """Any HTTP answer from `{base_url}/models` proves the server is there; when it lists model ids,
        one must name the model asked for (unless `checks_model` is off), else nothing is sent. OpenRouter
        also reports the key's credit (GET /key) and refuses to start with none left. A missing key fails
        here, before any prompt is sent."""
        auth = self._auth()
        timeout = self._timeout(min(self.timeout_s, CHECK_TIMEOUT_S))
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout, headers=auth) as session,
                session.get(f"{self.base}/models") as resp,
            ):
                served = served_ids(resp.status, await resp.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise FatalError(
                f"cannot reach the {self.name} engine at {self.shown} ({type(exc).__name__}): start the server, "
                "or fix EAGLE_DATA_BASE_URL / the engine resource's base_url",
                kind="unreachable",
            ) from None
        if self.checks_model and served and not any(model_matches(name, self.model) for name in served):
            raise self._scrubbed(self._mismatch(served))
        if not self.reports_credit:
            return f"{self.name} engine at {self.shown}: reachable, model {self.model}"
        try:
            info = await asyncio.to_thread(
                check_credit, self.base, self.api_key_env or OPENROUTER_KEY_ENV, timeout.total or CHECK_TIMEOUT_S
            )
        except EngineError as exc:
            raise self._scrubbed(exc) from None
        if info.remaining_usd is not None and info.remaining_usd <= 0:
            raise FatalError(f"{info.line()}: add credit or raise the key's limit before running", kind="no_credit")
        return info.line()

    def _mismatch(self, served: list[str]) -> ModelMismatchError:
        more = f" and {len(served) - SHOWN_IDS} more" if len(served) > SHOWN_IDS else ""
        names = ", ".join(repr(name) for name in served[:SHOWN_IDS])
        return ModelMismatchError(
            f"the {self.name} engine at {self.shown} serves {names}{more}, not {self.model!r}: set EAGLE_DATA_MODEL "
            "to the id the server lists, or point EAGLE_DATA_BASE_URL at a server of that model"
        )

    async def complete(
        self, messages: list[Message], *, prompt_id: str, sampling: Sampling | None = None
    ) -> Completion:
        """`sampling`: this prompt's setting of a sampling mixture, sent in place of the engine's own."""
        try:
            return await self._complete(messages, prompt_id, self.overrides(sampling) if sampling else {})
        except EngineError as exc:
            raise self._scrubbed(exc) from None

    def overrides(self, setting: Sampling) -> dict[str, Any]:
        """A mixture setting as request fields: sampling as is; reasoning effort and thinking in OpenRouter's
        `reasoning` object, or for other servers as `reasoning_effort` and the chat template's
        `enable_thinking`."""
        out: dict[str, Any] = {
            k: v for k in ("temperature", "top_p", "min_p") if (v := getattr(setting, k)) is not None
        }
        if self.reasoning_request:
            reasoning = dict(self._body.get("reasoning") or {})
            reasoning.update({"effort": setting.reasoning_effort} if setting.reasoning_effort else {})
            reasoning.update({"enabled": setting.thinking} if setting.thinking is not None else {})
            out.update({"reasoning": reasoning} if reasoning else {})
            return out
        out.update({"reasoning_effort": setting.reasoning_effort} if setting.reasoning_effort else {})
        if setting.thinking is not None:
            out["chat_template_kwargs"] = {
                **self._body.get("chat_template_kwargs", {}),
                "enable_thinking": setting.thinking,
            }
        return out

    async def served_prompt_ids(self, messages: list[Message]) -> list[int]:
        """One request for a one-token reply, with every other field as the run sends it (the thinking switch
        changes the rendered prompt): the prompt ids the server reports rendering."""
        try:
            done = await self._complete(messages, TEMPLATE_PROBE_ID, {"max_tokens": 1})
        except EngineError as exc:
            raise self._scrubbed(exc) from None
        if done.prompt_ids is None:
            raise FatalError(
                "the server answered without prompt_token_ids: it ignores return_token_ids for the prompt; upgrade "
                "vLLM, or use EAGLE_DATA_ENGINE=openai to run without token ids",
                kind="config",
            )
        return done.prompt_ids

    async def _complete(self, messages: list[Message], prompt_id: str, overrides: dict[str, Any]) -> Completion:
        if self._session is None:
            self._session = self._open()
        turns = [{"role": m["role"], "content": m["content"]} for m in messages]
        payload = {**self._body, **overrides, "messages": turns}
        try:
            async with self._session.post(
                self.url, data=json.dumps(payload).encode(), headers={PROMPT_ID_HEADER: prompt_id}
            ) as resp:
                body = await resp.read()
                retry_after = resp.headers.get("Retry-After")
                return parse_response(resp.status, body, retry_after, markers=self.markers, token_ids=self.token_ids)
        except aiohttp.ConnectionTimeoutError:
            raise RetryableError(f"no connection to {self.shown} within {self.connect_timeout_s:g} s",
                                 kind="connect_timeout") from None  # fmt: skip
        except TimeoutError:
            raise RetryableError(f"no whole answer within {self.timeout_s:g} s", kind="timeout") from None
        except aiohttp.ClientConnectorError as exc:  # before ClientOSError, its base class
            raise RetryableError(f"cannot connect to {self.shown}: {exc}", kind="connect") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise RetryableError(f"connection reset: {exc}", kind="reset") from None

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
            await asyncio.sleep(0)  # let the connector close its transports


@dataclass(frozen=True)
class KeyInfo:
    """Credit state of an OpenRouter key (GET /api/v1/key); never holds the key or its label."""

    usage_usd: float
    limit_usd: float | None
    remaining_usd: float | None

    def line(self) -> str:
        if self.limit_usd is None:
            return f"OpenRouter key: no credit limit set, ${self.usage_usd:.2f} used"
        left = f"${self.remaining_usd:.2f}" if self.remaining_usd is not None else "?"
        return f"OpenRouter key: {left} credit left of ${self.limit_usd:.2f} (${self.usage_usd:.2f} used)"


def check_credit(
    base_url: str = OPENROUTER_URL, api_key_env: str = OPENROUTER_KEY_ENV, timeout_s: float = 30.0
) -> KeyInfo:
    """Pre-flight: how much credit the key has left, before anything is spent."""
    key = settings.get(api_key_env)
    if not key:
        raise FatalError(f"environment variable {api_key_env} is empty: export the API key", kind="auth_missing")
    request = urllib.request.Request(base_url.rstrip("/") + "/key", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            data = json.loads(resp.read()).get("data") or {}
    except urllib.error.HTTPError as exc:
        raise http_error(exc.code, exc.read(), exc.headers.get("Retry-After"), time.time()) from None
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:  # no answer, or not the key's JSON
        raise FatalError(
            f"cannot read the key's credit at {mask_url(base_url.rstrip('/'))}/key ({type(exc).__name__}): "
            "check the base URL",
            kind="unreachable",
        ) from None
    limit = data.get("limit")
    remaining = data.get("limit_remaining")
    return KeyInfo(
        usage_usd=float(data.get("usage") or 0.0),
        limit_usd=None if limit is None else float(limit),
        remaining_usd=None if remaining is None else float(remaining),
    )


def build_compatible(settings: EngineSettings, spec: DatasetSpec) -> Engine:
    """An OpenAI-compatible kind from resolved settings: the record's own `make` with the dataset's sampling
    and its target's think-block markers."""
    g = spec.generation
    given = {"base_url": settings.base_url, "provider": settings.provider, "reasoning": settings.reasoning}
    return lookup(settings.kind).make(
        model=settings.model, api_key_env=settings.key_env(), max_tokens=g.max_tokens, temperature=g.temperature,
        top_p=g.top_p, thinking=g.thinking, markers=reasoning_markers(spec.target), **settings.timeouts(),
        **{k: v for k, v in given.items() if v},
    )  # fmt: skip


def make_openai(*, base_url: str = "", name: str = OPENAI, **arguments: Any) -> OpenAICompatEngine:
    """Any OpenAI-compatible server: never falls back to another provider's URL (the key would go there)."""
    if not base_url:
        raise FatalError(f"engine {name} needs a base URL: set EAGLE_DATA_BASE_URL (e.g. http://host:30000/v1)",
                         kind="config")  # fmt: skip
    return OpenAICompatEngine(name=name, base_url=base_url, **arguments)


def make_openrouter(*, api_key_env: str = OPENROUTER_KEY_ENV, **arguments: Any) -> OpenAICompatEngine:
    """OpenRouter's /models is a catalogue, not every id it takes (routing variants like `:nitro` are not
    listed), so the served model is not checked there: the server refuses an unknown id on each request."""
    return OpenAICompatEngine(
        name=OPENROUTER,
        api_key_env=api_key_env,
        reasoning_request=True,
        reports_credit=True,
        checks_model=False,
        **arguments,
    )


MODEL_FIX = "set EAGLE_DATA_MODEL (e.g. Qwen/Qwen3-8B)"
HTTP_SETTINGS = frozenset({"base_url", "api_key_env", "timeout_s", "connect_timeout_s"})
ROUTED_SETTINGS = HTTP_SETTINGS | {"provider", "reasoning"}  # OpenRouter's request fields (a gateway may take them)
register(EngineKind(
    name=OPENAI, build=build_compatible, make=make_openai, takes=ROUTED_SETTINGS, key_env="OPENAI_API_KEY",
    summary="any OpenAI-compatible server at EAGLE_DATA_BASE_URL",
    required={"model": MODEL_FIX, "base_url": "set EAGLE_DATA_BASE_URL (e.g. http://host:30000/v1)"},
))  # fmt: skip
register(EngineKind(
    name=OPENROUTER, build=build_compatible, make=make_openrouter, takes=ROUTED_SETTINGS,
    summary="OpenRouter's API", key_env=OPENROUTER_KEY_ENV, required={"model": MODEL_FIX}, billing="reported",
))  # fmt: skip
