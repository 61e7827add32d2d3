"""OpenRouter's credit check (GET /api/v1/key): how much credit the key has left, read once before a run."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from eagle_data import settings
from eagle_data.engines.openai_protocol import http_error
from eagle_data.secrets import mask_url
from eagle_data.types import KeyMissing, Unreachable

OPENROUTER_URL = "https://openrouter.ai/api/v1"
OPENROUTER_KEY_ENV = "OPENROUTER_API_KEY"


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
        raise KeyMissing(f"environment variable {api_key_env} is empty: export the API key")
    request = urllib.request.Request(base_url.rstrip("/") + "/key", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            data = json.loads(resp.read()).get("data") or {}
    except urllib.error.HTTPError as exc:
        raise http_error(exc.code, exc.read(), exc.headers.get("Retry-After"), time.time()) from None
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:  # no answer, or not the key's JSON
        raise Unreachable(
            f"cannot read the key's credit at {mask_url(base_url.rstrip('/'))}/key ({type(exc).__name__}): "
            "check the base URL",
        ) from None
    limit = data.get("limit")
    remaining = data.get("limit_remaining")
    return KeyInfo(
        usage_usd=float(data.get("usage") or 0.0),
        limit_usd=None if limit is None else float(limit),
        remaining_usd=None if remaining is None else float(remaining),
    )
