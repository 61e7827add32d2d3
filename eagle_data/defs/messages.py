"""What a user reads in Dagster: errors they can cause as one line, warnings at WARNING level.

The pure rooms raise their own exception types with a message written for the person running the job
(naming the dataset, file or setting). Raised as they are, Dagster shows them as a Python class path and
a stack trace; `user_failure` turns them into a `dg.Failure` that carries only the message. The pure
rooms log through one plain callable and mark warnings with a leading "WARNING "; `leveled` sends those
lines to Dagster's WARNING level, so the run's log filter and the UI show them as warnings.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import dagster as dg

from eagle_data.catalog import CatalogError
from eagle_data.drafter.evalsets import BenchmarkError
from eagle_data.drafter.vocab import VocabError
from eagle_data.engines.launcher import LaunchError
from eagle_data.exports import ExportError
from eagle_data.sources import SourceError
from eagle_data.storage import StorageError
from eagle_data.targets.profile import TargetError
from eagle_data.types import FatalError

USER_ERRORS: tuple[type[Exception], ...] = (
    BenchmarkError, CatalogError, ExportError, FatalError, LaunchError, SourceError, StorageError, TargetError,
    VocabError,
)  # fmt: skip

F = TypeVar("F", bound=Callable[..., Any])


def user_failure(fn: F) -> F:
    """Wraps an asset body: a user-caused error becomes a one-line `dg.Failure` (no class path, no trace)."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            raise dg.Failure(description=str(exc), metadata={"error": type(exc).__name__}) from None

    return body  # type: ignore[return-value]


WARNING_PREFIX = "WARNING "


def leveled(log: logging.Logger | logging.LoggerAdapter) -> Callable[[str], None]:
    """A pure room's `log` callable on a Dagster logger: lines starting "WARNING " at WARNING, others at INFO."""

    def line(text: str) -> None:
        (log.warning if text.startswith(WARNING_PREFIX) else log.info)(text)

    return line
