"""A read-only web server for the output root, so the links on Dagster's asset pages open.

Chromium refuses a `file://` link from an `http://` page (Dagster's UI), and Dagster's webserver serves
no files of ours. Started beside `dagster dev` (`python -m eagle_data.files_server`, README), it answers GET
and HEAD for the files under the root and nothing else: no listing, no writes, nothing outside the root
(symlinks included), on 127.0.0.1 unless told otherwise. Where it is reached is one setting,
`EAGLE_DATA_FILES_URL`: the metadata links are built from it and the server listens on its host and port.

On a folder root it is aiohttp's static file handler (Range, HEAD, If-Modified-Since, symlinks leaving the
root refused); on S3 it signs a GET for the asked key when asked and redirects there (302), so no signed
URL, and no session token inside one, is ever stored in Dagster's event log (docs/running.md, "Outputs").
aiohttp, not a hand-built server, because it is a dependency already and its server closes a connection
that has not sent a whole request within its keep-alive timeout, listens with a real backlog, and holds
no thread per connection (docs/facts.md, "The files server").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote, urlsplit

from aiohttp import web

from eagle_data import layout, settings
from eagle_data.storage import ShardStore, StorageError, default_root
from eagle_data.storage.s3 import S3Files

FILES_URL_ENV = "EAGLE_DATA_FILES_URL"
DEFAULT_FILES_URL = "http://127.0.0.1:3001"  # beside `dagster dev` on :3000
IDLE_TIMEOUT_S = 15.0  # a connection with no whole request for this long is closed (slow headers, idle keep-alive)
BACKLOG = 1024  # connections the kernel queues before the server accepts them (http.server's was 5)
REDIRECT_EXPIRES_S = 3600  # an S3 redirect's signature: followed at once by the browser, so one hour is plenty


def browser_link(store: ShardStore, key: str) -> str | None:
    """A URL of `key` that opens in a browser from Dagster's UI: on this server, when `EAGLE_DATA_FILES_URL`
    says where it is (on S3 it redirects to a GET signed then); otherwise none (the path or s3:// URI is all
    there is). Never a signed URL: metadata is stored for good, and a signature carries the credentials' id
    and, for temporary credentials, their session token."""
    base = settings.get(FILES_URL_ENV).rstrip("/")
    return f"{base}/{quote(key)}" if base else None


def make_app(store: ShardStore) -> web.Application:
    """The server's routes for `store`: the folder's files, or on S3 a signed redirect per key."""
    app = web.Application()
    if isinstance(store.files, S3Files):
        app.router.add_get("/{key:.+}", _signed_redirect(store.files))  # HEAD too (aiohttp's allow_head)
    else:
        app.router.add_static("/", store.root, follow_symlinks=False, show_index=False)
    return app


def _signed_redirect(files: S3Files) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def redirect(request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        if any(part in ("", ".", "..") for part in key.split(layout.SEP)):
            raise web.HTTPNotFound()  # a key the layout never writes: no signature for it
        try:
            link = await asyncio.to_thread(files.link, key, REDIRECT_EXPIRES_S)
        except StorageError as exc:
            raise web.HTTPServiceUnavailable(text=f"{exc}\n") from None
        raise web.HTTPFound(link)

    return redirect


def listen_address(url: str) -> tuple[str, int]:
    """Host and port of a files URL such as http://127.0.0.1:3001 (port 80 when it names none)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit(f"{FILES_URL_ENV}={url!r}: use http://HOST:PORT, e.g. {DEFAULT_FILES_URL}")
    return parts.hostname, parts.port or 80


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eagle_data.files_server", description=__doc__.split("\n")[0])
    where = f"where the links point (default ${FILES_URL_ENV}, else {DEFAULT_FILES_URL})"
    parser.add_argument("--url", default=settings.get(FILES_URL_ENV) or DEFAULT_FILES_URL, help=where)
    parser.add_argument("--listen", default="", help="host:port to listen on, when not the URL's (in a container)")
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_S, help="seconds a connection may wait "
                        f"without a whole request (default {IDLE_TIMEOUT_S:g})")  # fmt: skip
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    host, port = listen_address(f"http://{args.listen}" if args.listen else url)
    store = ShardStore(default_root())
    try:
        if not store.is_s3:  # started before the first run: the folder it will write, empty until then
            Path(store.root).mkdir(parents=True, exist_ok=True)
        app = make_app(store)
    except (OSError, ValueError) as exc:  # aiohttp's static route refuses a root that is no folder (ValueError)
        raise SystemExit(f"cannot serve the output root {store.root}: {exc}") from None
    said = f"serving {store.root} read-only on {url}/ (links on the asset pages need {FILES_URL_ENV} set to it)"
    try:
        web.run_app(app, host=host, port=port, backlog=BACKLOG, keepalive_timeout=args.idle_timeout,
                    access_log=None, print=lambda _: print(said, file=sys.stderr, flush=True))  # fmt: skip
    except OSError as exc:
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}; set {FILES_URL_ENV} to another") from None


if __name__ == "__main__":
    main()
