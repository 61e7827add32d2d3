"""OpenAI-compatible chat engine (OpenRouter, vLLM, SGLang's /v1, `transformers serve`) on bare aiohttp.

The hot path is one shared aiohttp session with a pool sized for thousands of requests in flight. The
openai SDK is not used: on its own aiohttp transport it reached 0.29x this client's throughput in the same
pipeline at 2,000 in flight (docs/facts.md), so the client would be the bottleneck. What the SDK would
bring is here in small parts: typed errors (`openai_protocol`: retryable, run-stopping, fatal, sorted by
status and body), Retry-After (eagle_data/retry_after.py), provider routing and reasoning as request
fields. The API key is read from an environment variable when the session opens; it is never in
`config()`, logs, or files, and server error text is redacted of it before it becomes an error.
Registers two kinds: `openai` (any OpenAI-compatible server) and `openrouter`.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import aiohttp

from eagle_data import settings
from eagle_data.engines import EngineKind, EngineSettings, lookup, register
from eagle_data.engines.openai_protocol import parse_response, served_ids
from eagle_data.engines.openrouter_key import OPENROUTER_KEY_ENV, OPENROUTER_URL, check_credit
from eagle_data.engines.pacing import Pacing
from eagle_data.engines.served import ModelMismatchError, model_matches
from eagle_data.quality.sampled import asked_top_logprobs
from eagle_data.secrets import mask_url, redact, strip_credentials, url_parts
from eagle_data.targets.reasoning import THINK_TAGS, ReasoningMarkers, reasoning_markers
from eagle_data.types import (
    PROMPT_ID_HEADER,
    Completion,
    ConfigError,
    Engine,
    EngineError,
    FatalError,
    KeyMissing,
    Message,
    RetryableError,
    Sampling,
    Unreachable,
)

if TYPE_CHECKING:
    from eagle_data.catalog import DatasetSpec

OPENAI, OPENROUTER = "openai", "openrouter"
PROVIDER_KEYS = frozenset({
    "order", "only", "ignore", "quantizations", "allow_fallbacks", "sort", "require_parameters",
    "data_collection", "max_price", "enforce_distillable_text",
})  # fmt: skip
REASONING_KEYS = frozenset({"effort", "max_tokens", "exclude", "enabled"})
TIMEOUT_S = 600.0  # whole-request timeout: a long reasoning reply can take minutes
CONNECT_TIMEOUT_S = 10.0  # a dead host fails fast
CHECK_TIMEOUT_S = 30.0
SHOWN_IDS = 3  # served ids a mismatch error names
TEMPLATE_PROBE_ID = "template-check"  # the prompt id the pre-flight's request carries


def _checked(name: str, value: dict[str, Any] | None, allowed: frozenset[str]) -> dict[str, Any] | None:
    unknown = set(value or {}) - allowed
    if unknown:
        raise ValueError(f"{name}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    return dict(value) if value else None


def checked_base_url(base_url: str) -> str:
    """`base_url` if it is an absolute http(s) URL with a host, else a one-line config error."""
    if url_parts(base_url) is None:
        raise ConfigError(
            f"base URL {mask_url(base_url)!r} is not an http(s) URL with a host: set EAGLE_DATA_BASE_URL "
            "(e.g. http://host:30000/v1)"
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
        top_logprobs: int = 0,
        watch_pace: bool = False,
    ) -> None:
        """`reasoning_request`: the API takes OpenRouter's `reasoning` request field, so the thinking
        switch goes there (else into `chat_template_kwargs`); `reports_credit`: it answers GET /key with
        the key's credit, checked before anything is sent; `checks_model`: GET /models lists every model
        the server serves, so a model missing from a non-empty list is refused before anything is sent;
        `markers`: the target's think-block markers (None: its format has none), for replies that leave a
        think block inside `content`; `token_ids`: ask for the reply's and the prompt's token ids (vLLM's
        `return_token_ids`) and refuse an answer without them; `top_logprobs` > 0: ask in the same request for the
        sampled tokens' log-probabilities with that many most likely tokens each (OpenAI's `logprobs`), refuse an
        answer without them, and leave them out of `config()` (they change no reply); `watch_pace`: notice a server
        that answers one request at a time and then send one at a time (`pacing`; requests given up at the timeout
        are counted either way)."""
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
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
        body.update(_switches(provider, reasoning, thinking, reasoning_request=reasoning_request))
        if token_ids:
            body["return_token_ids"] = True
        body.update(extra_body or {})
        self._body, self.token_ids, self.reports_prompt_ids = body, token_ids, token_ids
        self.top_logprobs = top_logprobs
        self._logprobs = {"logprobs": True, "top_logprobs": top_logprobs} if top_logprobs else {}
        self._session: aiohttp.ClientSession | None = None
        self.pacing = Pacing(timeout_s, watch=watch_pace)

    def config(self) -> dict[str, Any]:
        """Everything that changes the output (no URL, timeout or key)."""
        return {"engine": self.name, **self._body}

    def describe(self) -> str:
        return f"{self.name} {self.model} at {self.shown}"

    def stats(self) -> dict[str, Any]:
        """Whether the server was seen answering one request at a time, and the requests given up on it."""
        if not self.pacing.line():
            return {}
        return {"answers_one_at_a_time": self.pacing.serial, "abandoned_requests": self.pacing.abandoned}

    def stats_line(self) -> str:
        return self.pacing.line()

    def _auth(self) -> dict[str, str]:
        """The Authorization header (basic auth from the URL, or the key); a one-line error when the key
        is needed and unset."""
        key = settings.get(self.api_key_env) if self.api_key_env else ""
        if self._basic is not None:
            if key:
                raise ConfigError(
                    f"the base URL {self.shown} carries credentials and {self.api_key_env} holds an API key: "
                    "keep one (drop the user:password from EAGLE_DATA_BASE_URL, or unset the key)"
                )
            return {"Authorization": self._basic}
        if self.api_key_env and not key:
            raise KeyMissing(f"environment variable {self.api_key_env} is empty: export the API key")
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
            raise self._unreachable(exc, timeout.total or CHECK_TIMEOUT_S) from None
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

    def _unreachable(self, exc: BaseException, waited_s: float) -> Unreachable:
        """A refused or failed connection asks for a server or a URL; a server that took the connection and
        never answered (hung, still loading, a black hole) says so and names the timeout that bounded it."""
        if not isinstance(exc, TimeoutError) or isinstance(exc, aiohttp.ConnectionTimeoutError):
            return Unreachable(
                f"cannot reach the {self.name} engine at {self.shown} ({type(exc).__name__}): start the server, "
                "or fix EAGLE_DATA_BASE_URL (or the variable the run config's base_url_env names)",
            )
        longer = f", or raise EAGLE_DATA_TIMEOUT_S above {waited_s:g}" if waited_s < CHECK_TIMEOUT_S else ""
        return Unreachable(
            f"the {self.name} engine at {self.shown} took the connection but sent no answer to GET /models within "
            f"{waited_s:g} s: restart the server or wait for it to finish loading, or point EAGLE_DATA_BASE_URL "
            f"at a live one{longer}",
        )

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
            raise ConfigError(
                "the server answered without prompt_token_ids: it ignores return_token_ids for the prompt; upgrade "
                "vLLM, or use EAGLE_DATA_ENGINE=openai to run without token ids"
            )
        return done.prompt_ids

    async def _complete(self, messages: list[Message], prompt_id: str, overrides: dict[str, Any]) -> Completion:
        if self._session is None:
            self._session = self._open()
        turns = [{"role": m["role"], "content": m["content"]} for m in messages]
        payload = {**self._body, **self._logprobs, **overrides, "messages": turns}
        sent, tokens, abandoned = await self.pacing.start(), None, False
        try:
            async with self._session.post(
                self.url, data=json.dumps(payload).encode(), headers={PROMPT_ID_HEADER: prompt_id}
            ) as resp:
                body = await resp.read()
                retry_after = resp.headers.get("Retry-After")
                done = parse_response(resp.status, body, retry_after, markers=self.markers, token_ids=self.token_ids,
                                      top_logprobs=self.top_logprobs)  # fmt: skip
                tokens = done.completion_tokens
                return done
        except aiohttp.ConnectionTimeoutError:
            raise RetryableError(f"no connection to {self.shown} within {self.connect_timeout_s:g} s",
                                 kind="connect_timeout") from None  # fmt: skip
        except TimeoutError:
            abandoned = True
            raise RetryableError(f"no whole answer within {self.timeout_s:g} s", kind="timeout") from None
        except aiohttp.ClientConnectorError as exc:  # before ClientOSError, its base class
            raise RetryableError(f"cannot connect to {self.shown}: {exc}", kind="connect") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise RetryableError(f"connection reset: {exc}", kind="reset") from None
        finally:
            self.pacing.done(sent, tokens, abandoned=abandoned)

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
            await asyncio.sleep(0)  # let the connector close its transports


def build_compatible(settings: EngineSettings, spec: DatasetSpec) -> Engine:
    """An OpenAI-compatible kind from resolved settings: the record's own `make` with the dataset's sampling
    and its target's think-block markers."""
    g = spec.generation
    given = {"base_url": settings.base_url, "provider": settings.provider, "reasoning": settings.reasoning}
    return lookup(settings.kind).make(
        model=settings.model, api_key_env=settings.key_env(), max_tokens=g.max_tokens, temperature=g.temperature,
        top_p=g.top_p, thinking=g.thinking, markers=reasoning_markers(spec.target), **settings.timeouts(),
        top_logprobs=asked_top_logprobs(spec.on_policy),
        **{k: v for k, v in given.items() if v},
    )  # fmt: skip


def make_openai(*, base_url: str = "", name: str = OPENAI, **arguments: Any) -> OpenAICompatEngine:
    """Any OpenAI-compatible server: never falls back to another provider's URL (the key would go there)."""
    if not base_url:
        raise ConfigError(f"engine {name} needs a base URL: set EAGLE_DATA_BASE_URL (e.g. http://host:30000/v1)")
    return OpenAICompatEngine(name=name, base_url=base_url, watch_pace=name == OPENAI, **arguments)


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


def _switches(
    provider: dict[str, Any] | None, reasoning: dict[str, Any] | None, thinking: bool | None, *, reasoning_request: bool
) -> dict[str, Any]:
    """The request's routing and reasoning fields: OpenRouter's `provider` and `reasoning` objects as given
    (checked), else the thinking switch where the API reads it (`reasoning.enabled` or `chat_template_kwargs`)."""
    out: dict[str, Any] = {}
    if provider := _checked("provider", provider, PROVIDER_KEYS):
        out["provider"] = provider
    if reasoning := _checked("reasoning", reasoning, REASONING_KEYS):
        out["reasoning"] = reasoning
    elif thinking is not None and reasoning_request:
        out["reasoning"] = {"enabled": thinking}
    elif thinking is not None:
        out["chat_template_kwargs"] = {"enable_thinking": thinking}
    return out
