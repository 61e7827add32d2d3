"""What one SGLang URL serves, asked before any prompt is sent: an SGLang worker or an sglang-router.

SGLang 0.5.23 serves `/server_info` and `/model_info` and keeps `/get_server_info` and `/get_model_info`
as deprecated aliases "to be removed"; the current names are asked first and the old ones only when a
server answers 404 (SGLang before the rename). sglang-router answers JSON under `text/plain`, so bodies
are parsed whatever their content type. A router's server info is its own (`"router_manager": true`), not
a worker's: the router is then one server to this client (it balances and fails over itself), and its
`/workers` list is checked instead: at least one healthy worker, every one serving the target model.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from eagle_data.engines.served import ModelMismatchError, model_matches
from eagle_data.secrets import mask_url
from eagle_data.types import FatalError, RetryableError

SERVER_INFO = ("/server_info", "/get_server_info")  # current first, deprecated fallback
MODEL_INFO = ("/model_info", "/get_model_info")
WHERE = "point EAGLE_DATA_BASE_URL at SGLang servers or one sglang-router (http://host:port, no path)"


class NotSGLangError(FatalError):
    """The URL answers, but not as SGLang or sglang-router does (an HTML page, a proxy, another server)."""

    kind = "not_sglang"


class NoHealthyWorkerError(FatalError):
    """An sglang-router with no healthy worker behind it."""

    kind = "server_down"


async def probe(session: aiohttp.ClientSession, url: str, model: str, timeout_s: float) -> dict[str, Any]:
    """The server info of `url`, checked: /health 200 and the target model served (by the server, or by
    every healthy worker of a router, whose info then carries `router: True` and `workers: N`).

    Raises ModelMismatchError, NotSGLangError or NoHealthyWorkerError (fatal: configuration), and the
    connection errors or RetryableError while the server is not (yet) usable.
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    shown = mask_url(url)
    async with session.get(url + "/health", timeout=timeout) as resp:
        if resp.status != 200:
            raise RetryableError(f"{shown}/health answered {resp.status}", kind="server_down")
    info = await _first_json(session, url, SERVER_INFO, timeout)
    if info.get("router_manager"):
        workers = await _router_workers(session, url, model, timeout)
        return {**info, "router": True, "workers": workers}
    served = await _first_json(session, url, MODEL_INFO, timeout)
    names = [str(served.get(key) or "") for key in ("served_model_name", "model_path")]
    if not any(model_matches(name, model) for name in names if name):
        raise ModelMismatchError(
            f"SGLang server {shown} serves {served.get('model_path')!r}, but the target model is {model!r}: "
            "start it with --model-path for the target, or point the engine at the right servers"
        )
    return info


async def _router_workers(session: aiohttp.ClientSession, url: str, model: str, timeout: aiohttp.ClientTimeout) -> int:
    """How many healthy workers the router at `url` lists, each checked to serve `model`."""
    shown = mask_url(url)
    listed = (await _json(session, url, "/workers", timeout)).get("workers") or []
    healthy = [w for w in listed if isinstance(w, dict) and w.get("is_healthy")]
    if not healthy:
        raise NoHealthyWorkerError(
            f"sglang-router {shown} has no healthy worker ({len(listed)} registered): start its workers or fix "
            f"its --worker-urls, and wait until {shown}/workers lists them healthy"
        )
    for worker in healthy:
        served = str(worker.get("model_id") or (worker.get("metadata") or {}).get("model_path") or "")
        if not model_matches(served, model):
            raise ModelMismatchError(
                f"sglang-router {shown}: its worker {mask_url(str(worker.get('url', '?')))} serves {served!r}, but "
                f"the target model is {model!r}: remove that worker from the router, or route to the target's servers"
            )
    return len(healthy)


async def _first_json(
    session: aiohttp.ClientSession, url: str, paths: tuple[str, ...], timeout: aiohttp.ClientTimeout
) -> dict[str, Any]:
    """The JSON object of the first of `paths` that is not 404 (newer names first)."""
    for path in paths[:-1]:
        if (body := await _json(session, url, path, timeout, missing_ok=True)) is not None:
            return body
    return await _json(session, url, paths[-1], timeout)


async def _json(
    session: aiohttp.ClientSession, url: str, path: str, timeout: aiohttp.ClientTimeout, *, missing_ok: bool = False
) -> Any:
    """GET `url + path` as a JSON object, whatever its content type; None for a 404 when `missing_ok`."""
    shown = mask_url(url) + path
    async with session.get(url + path, timeout=timeout) as resp:
        if resp.status == 404 and missing_ok:
            return None
        text = await resp.text(errors="replace")
        kind = resp.headers.get("Content-Type", "no content type")
    if resp.status >= 500:
        raise RetryableError(f"{shown} answered {resp.status}: {_snippet(text)}", kind="server_down")
    try:
        body = json.loads(text) if resp.status == 200 else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise NotSGLangError(f"{shown} answered {resp.status} ({kind}) {_snippet(text)!r}, not SGLang's JSON: {WHERE}")
    return body


def _snippet(text: str) -> str:
    return " ".join(text.split())[:80]
