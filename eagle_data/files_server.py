"""A read-only web server for a folder output root, so the links on Dagster's asset pages open.

Chromium refuses a `file://` link from an `http://` page (Dagster's UI), and Dagster's webserver serves
no files of ours; on S3 a presigned URL opens, under a folder nothing would. Started beside `dagster dev`
(`python -m eagle_data.files_server`, README), it answers GET and HEAD for the files under the root and
nothing else: no listing, no writes, no path outside the root, on 127.0.0.1 unless told otherwise. Where
it is reached is one setting, `EAGLE_DATA_FILES_URL`: the metadata links are built from it and the
server listens on its host and port.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, urlsplit

from eagle_data import settings
from eagle_data.storage import ShardStore, default_root

FILES_URL_ENV = "EAGLE_DATA_FILES_URL"
DEFAULT_FILES_URL = "http://127.0.0.1:3001"  # beside `dagster dev` on :3000


def browser_link(store: ShardStore, key: str) -> str | None:
    """A URL of `key` that opens in a browser from Dagster's UI: presigned on S3; under a folder root, on
    this server when `EAGLE_DATA_FILES_URL` says where it is; otherwise none (the path is all there is)."""
    if store.is_s3:
        return store.link(key)
    base = settings.get(FILES_URL_ENV).rstrip("/")
    return f"{base}/{quote(key)}" if base else None


class ReadOnlyFiles(SimpleHTTPRequestHandler):
    """GET/HEAD of the files under `directory`; a folder is 404 (no listing), other methods 501 (the base's)."""

    def list_directory(self, path: str | Path) -> None:
        self.send_error(HTTPStatus.NOT_FOUND, "no listing here: open a file's link")
        return None

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: one line per request would drown the terminal beside `dagster dev`."""


def make_server(root: str, host: str, port: int) -> ThreadingHTTPServer:
    """A server for `root` on host:port (port 0: a free one, read back from `server_address`)."""
    handler = functools.partial(ReadOnlyFiles, directory=root)
    return ThreadingHTTPServer((host, port), handler)


def listen_address(url: str) -> tuple[str, int]:
    """Host and port of a files URL such as http://127.0.0.1:3001 (port 80 when it names none)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit(f"{FILES_URL_ENV}={url!r}: use http://HOST:PORT, e.g. {DEFAULT_FILES_URL}")
    return parts.hostname, parts.port or 80


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eagle_data.files_server", description=__doc__.split("\n")[0])
    where = f"where the files are served (default ${FILES_URL_ENV}, else {DEFAULT_FILES_URL})"
    parser.add_argument("--url", default=settings.get(FILES_URL_ENV) or DEFAULT_FILES_URL, help=where)
    args = parser.parse_args(argv)
    root = default_root()
    if root.startswith("s3://"):
        raise SystemExit(f"the output root {root} is on S3: its links are presigned, no files server is needed")
    host, port = listen_address(args.url)
    try:
        server = make_server(root, host, port)
    except OSError as exc:
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}; set {FILES_URL_ENV} to another") from None
    print(f"serving {root} read-only on {args.url.rstrip('/')}/ (links on the asset pages need {FILES_URL_ENV} "
          f"set to it)", file=sys.stderr, flush=True)  # fmt: skip
    with server, contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends it quietly
        server.serve_forever()


if __name__ == "__main__":
    main()
