"""A slow-drip answer: the whole body sent one byte at a time, so no single read ever waits long."""

from __future__ import annotations

import asyncio

from aiohttp import web


async def drip(request: web.Request, body: bytes, every_s: float, status: int = 200) -> web.StreamResponse:
    """Send `body` as JSON, one byte every `every_s` seconds (stops when the client hangs up)."""
    stream = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
    stream.content_length = len(body)
    await stream.prepare(request)
    for i in range(len(body)):
        await asyncio.sleep(every_s)
        if request.transport is None or request.transport.is_closing():
            return stream  # the client hung up: a server shutting down need not wait for the rest
        await stream.write(body[i : i + 1])
    await stream.write_eof()
    return stream
