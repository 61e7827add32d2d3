"""The files server under hostile clients (issue 43, item 4), each against the real `python -m
eagle_data.files_server`: a symlink out of the root, connections that never finish their headers, a burst of
concurrent GETs, clients that hang up mid-file; and the HEAD and Range requests a browser sends."""

from __future__ import annotations

import asyncio
import http.client
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from eagle_data_tests.integration.test_ui_files_server import fetch, files_server_process

SLOW = 60  # connections that send half a request and wait (bounded: the machine is shared)
BURST = 300  # concurrent GETs
BIG = 8 * 1024 * 1024  # a file a client hangs up on


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "out" / "b7_sharegpt").mkdir(parents=True)
    (tmp_path / "out" / "b7_sharegpt" / "x.txt").write_bytes(b"0123456789")
    return tmp_path / "out"


def test_a_symlink_inside_the_root_serves_nothing_outside_it(root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("outside the root")
    (root / "b7_sharegpt" / "etc").symlink_to("/etc")
    (root / "b7_sharegpt" / "secret.txt").symlink_to(tmp_path / "secret.txt")
    (root / "b7_sharegpt" / "also.txt").symlink_to(root / "b7_sharegpt" / "x.txt")  # inside: fine
    with files_server_process(str(root)) as served:
        assert fetch(f"{served.url}/b7_sharegpt/etc/passwd")[0] == 404
        assert fetch(f"{served.url}/b7_sharegpt/secret.txt")[0] == 404
        assert fetch(f"{served.url}/b7_sharegpt/also.txt") == (200, b"0123456789")


def test_connections_that_never_finish_their_headers_are_closed_and_others_still_answered(root: Path) -> None:
    with files_server_process(str(root), "--idle-timeout", "1") as served:
        port = urlsplit(served.url).port or 0
        slow = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(SLOW)]
        for sock in slow:
            sock.sendall(b"GET /b7_sharegpt/x.txt HTTP/1.1\r\nHost: x\r\n")  # no blank line: never a whole request
        assert fetch(f"{served.url}/b7_sharegpt/x.txt") == (200, b"0123456789")  # while they wait
        started, closed = time.monotonic(), 0
        for sock in slow:
            sock.settimeout(max(0.1, started + 6 - time.monotonic()))
            try:
                closed += sock.recv(1024) == b""  # the server closed it
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
            sock.close()
        assert closed == SLOW, f"{SLOW - closed} of {SLOW} half-sent requests still held after 6 s"


def test_a_burst_of_concurrent_gets_is_answered_in_full(root: Path) -> None:
    async def one(port: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /b7_sharegpt/x.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status = int((await reader.readline()).split()[1])
        await reader.read()
        writer.close()
        return status

    async def burst(port: int) -> list[int | BaseException]:
        return await asyncio.gather(*(one(port) for _ in range(BURST)), return_exceptions=True)

    with files_server_process(str(root)) as served:
        started = time.monotonic()
        statuses = asyncio.run(asyncio.wait_for(burst(urlsplit(served.url).port or 0), timeout=20))
        took = time.monotonic() - started
    assert statuses.count(200) == BURST, {repr(s) for s in statuses if s != 200}
    assert took < 10, f"{BURST} concurrent GETs took {took:.1f} s"


def test_clients_hanging_up_mid_file_leave_the_log_quiet(root: Path) -> None:
    (root / "b7_sharegpt" / "big.bin").write_bytes(os.urandom(BIG))
    with files_server_process(str(root)) as served:
        port = urlsplit(served.url).port or 0
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
                sock.sendall(b"GET /b7_sharegpt/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.recv(1024)
        assert fetch(f"{served.url}/b7_sharegpt/x.txt") == (200, b"0123456789")
    assert not [line for line in served.lines if line.strip()], served.lines[:20]


def test_head_and_range_requests(root: Path) -> None:
    with files_server_process(str(root)) as served:
        parts = urlsplit(served.url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        connection.request("HEAD", "/b7_sharegpt/x.txt")
        head = connection.getresponse()
        assert head.status == 200 and head.getheader("Content-Length") == "10" and head.read() == b""
        connection.request("GET", "/b7_sharegpt/x.txt", headers={"Range": "bytes=2-5"})
        part = connection.getresponse()
        assert part.status == 206 and part.read() == b"2345"
        assert part.getheader("Content-Range") == "bytes 2-5/10"
        connection.close()
