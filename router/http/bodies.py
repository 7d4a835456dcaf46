"""Reading a request body inside the app: whole, within a size and a deadline. The connection
layer (router/http/connection.py) enforces the same bounds for every path before the app runs;
this is the app's own check, which the in-process tier (no connection layer) relies on."""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from router.errors import ClientTooSlow, InvalidRequest, PayloadTooLarge


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body within `timeout_s` (else 408), refusing more than `limit` bytes (413)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit)
    except TimeoutError:
        raise ClientTooSlow(
            f"the request body did not arrive within limits.body_timeout_s ({timeout_s:g}s)"
        ) from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("invalid Content-Length header")
        if int(declared) > limit:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise InvalidRequest("the client closed the connection while sending the body") from exc
    return b"".join(chunks)
