"""What a user reads in Dagster: errors they can cause as one line, warnings at WARNING level, and
where every written file is.

The pure rooms raise their own exception types with a message written for the person running the job
(naming the dataset, file or setting), each derived from `types.UserError` where it is defined. Raised as
they are, Dagster shows them as a Python class path and a stack trace; `user_failure` turns any UserError
into a `dg.Failure` that carries only the message (the CLI, the UI and the alerts show that line). The pure
rooms log through one plain callable and mark warnings with a leading "WARNING "; `leveled` sends those
lines to Dagster's WARNING level, so the run's log filter and the UI show them as warnings. A written
file is shown as a path to copy, and with the files server running also as a link to it (never a signed URL:
metadata is kept for good); a browser refuses `file://` links from a web page.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import dagster as dg

from eagle_data.files_server import browser_link
from eagle_data.storage import ShardStore
from eagle_data.types import UserError

F = TypeVar("F", bound=Callable[..., Any])


def user_failure(fn: F) -> F:
    """Wraps a step's body (an asset's, or an asset check's generator): every `UserError` becomes a one-line
    `dg.Failure` (the line as its description, no cause, no class path in it); any other exception is a bug
    and keeps its class and traceback."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def steps(*args: Any, **kwargs: Any) -> Any:
            with _as_failure():
                yield from fn(*args, **kwargs)

        return steps  # type: ignore[return-value]

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        with _as_failure():
            return fn(*args, **kwargs)

    return body  # type: ignore[return-value]


@contextlib.contextmanager
def _as_failure() -> Iterator[None]:
    try:
        yield
    except UserError as exc:  # it names something to fix: a step retry policy would only repeat it
        line = " ".join(str(exc).split())  # one line, whatever the message held
        raise dg.Failure(description=line, metadata={"error": type(exc).__name__}, allow_retries=False) from None


WARNING_PREFIX = "WARNING "


def leveled(log: logging.Logger | logging.LoggerAdapter) -> Callable[[str], None]:
    """A pure room's `log` callable on a Dagster logger: lines starting "WARNING " at WARNING, others at INFO."""

    def line(text: str) -> None:
        (log.warning if text.startswith(WARNING_PREFIX) else log.info)(text)

    return line


def file_locations(store: ShardStore, files: Mapping[str, str]) -> dict[str, dg.MetadataValue]:
    """Metadata name -> storage key of written files: each as a copyable path, and as `<name>_link` a URL that
    opens in a browser where there is one (the files server's: browser_link)."""
    out: dict[str, dg.MetadataValue] = {}
    for name, key in files.items():
        out[name] = dg.MetadataValue.path(store.uri(key))
        if link := browser_link(store, key):
            out[f"{name}_link"] = dg.MetadataValue.url(link)
    return out


def uri_locations(store: ShardStore, figures: Mapping[str, object]) -> dict[str, dg.MetadataValue]:
    """The pure rooms' `*_path` figures (URIs under the store's root) as `file_locations`."""
    under = f"{store.root}/"
    return file_locations(store, {
        name: value.removeprefix(under) for name, value in figures.items()
        if name.endswith("_path") and isinstance(value, str) and value.startswith(under)
    })  # fmt: skip
