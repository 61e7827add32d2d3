"""The one module that reads the process environment: every other module asks here, at call time.

Reading at call time (never at import) is what lets run config, tests and `dagster dev` sessions change
a setting without re-importing the package. Secrets (API keys, the alert webhook) are read by the name
of their variable when a request needs them, and never copied into config, metadata, logs or files.
The variables themselves are listed in README's settings table; each is named by a constant beside the
code that uses it (e.g. `storage.ROOT_ENV`, `catalog.PROFILE_ENV`).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "EAGLE_DATA_CACHE"


def get(name: str) -> str:
    """The variable's value without surrounding blanks; "" when it is unset."""
    return os.environ.get(name, "").strip()


def set_default(name: str, value: str) -> None:
    """Set a variable for this process and its children unless the user already set it."""
    os.environ.setdefault(name, value)


def environment() -> dict[str, str]:
    """A copy of the whole environment, for a child process (Dagster's CLI, SGLang servers)."""
    return dict(os.environ)


def cache_folder() -> Path:
    """Where things built once and reused by every later process live (the demo model, converted tokenizers)."""
    return Path(get(CACHE_ENV) or Path.home() / ".cache" / "eagle-data").expanduser()
