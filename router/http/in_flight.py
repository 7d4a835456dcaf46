"""Requests in flight per process: an ASGI middleware that answers OpenAI-shaped 503s; and the
request ids every answer of the non-proxied routes carries. The bounds below HTTP
(connections, heads, bodies) are router/http/connection.py's."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.errors import GatewayError, Overloaded
from router.request.reply import request_id_headers


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


class RequestIds:
    """Every answer of the wrapped app carries `x-request-id` and `x-tidegate-request-id` (the
    same new id), unless it set its own: the admin, models, health and metrics routes, and
    FastAPI's own 404s and 405s. (The proxied routes set theirs: router/http/proxy.py.)"""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_with_ids(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers += [(k.encode(), v.encode()) for k, v in request_id_headers().items()]
                    message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receive, send_with_ids)


async def _send_error(send: Send, error: GatewayError) -> None:
    headers = [(b"content-type", b"application/json")]
    headers += [(k.encode(), v.encode()) for k, v in request_id_headers().items()]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", f"{error.retry_after_s:g}".encode()))
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": error.body()})
