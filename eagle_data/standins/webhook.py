"""A real webhook receiver on 127.0.0.1, standing in for Slack: what the alerts send, as received."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """A real webhook receiver on 127.0.0.1: records each POSTed JSON body; answers `status` after `delay`."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.status, self.delay = status, delay
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.bodies.append(json.loads(body))
                receiver.headers.append(dict(self.headers))
                time.sleep(receiver.delay)
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        """Shaped like a Slack webhook, with a secret-looking path that must never leak."""
        return f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/s3cr3tT0ken"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
