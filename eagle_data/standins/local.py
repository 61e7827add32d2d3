"""Ports and processes on this machine, for the servers tests and benchmarks start."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGINT lets `dagster dev` stop its webserver, daemon and code servers; SIGKILL takes what is left of
    its process group (started with start_new_session=True)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
