"""Requests in flight per process: an ASGI middleware that answers OpenAI-shaped 503s. The
bounds below HTTP (connections, heads, bodies) are router/http/connection.py's."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from router.errors import GatewayError, Overloaded


class InFlightLimit:
    """At most `limit` `/v1/` requests at once in this process, from the first byte of the
    request to the last byte of the answer (streams included); the rest get 503
    `server_overloaded` with `Retry-After`, before their body is read."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self._app = app
        self._limit = limit
        self._in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self._app(scope, receive, send)
            return
        if self._in_flight >= self._limit:
            await _send_error(
                send, Overloaded(f"the gateway has {self._limit} requests in flight (limits.max_in_flight)")
            )
            return
        self._in_flight += 1
        try:
            await self._app(scope, receive, send)
        finally:
            self._in_flight -= 1


async def _send_error(send: Send, error: GatewayError) -> None:
    headers = [(b"content-type", b"application/json")]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", f"{error.retry_after_s:g}".encode()))
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": error.body()})
