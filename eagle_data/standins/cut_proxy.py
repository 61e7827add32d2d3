"""A TCP proxy on 127.0.0.1 whose link can be cut for N seconds: a network outage in front of a real server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class CutProxy:
    """Forwards 127.0.0.1:`port` to `target_port`. `cut(s)` closes the listener and every open connection,
    so clients get connection refused (as from a dead endpoint), and listens again after `s` seconds."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listen()

    def _listen(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by cut()
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cut(self, seconds: float) -> threading.Thread:
        """Cut the link now, restore it after `seconds` (in the background); returns the restoring thread."""
        self.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

        def restore() -> None:
            time.sleep(seconds)
            self._listen()

        thread = threading.Thread(target=restore, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop listening (a shutdown first: it wakes the thread blocked in accept, which a close alone does not)."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
