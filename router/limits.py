"""Per-process bounds on what clients can hold: requests in flight (an ASGI middleware that
answers OpenAI-shaped 503s) and, below HTTP, connections, header bytes and the time a client
may take to send its headers (a uvicorn protocol). The values come from `limits.*`."""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

import httptools
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.config import LimitsConfig
from router.errors import ClientTooSlow, GatewayError, HeadersTooLarge, Overloaded


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


def _error_headers(error: GatewayError) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json")]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", f"{error.retry_after_s:g}".encode()))
    return headers


async def _send_error(send: Send, error: GatewayError) -> None:
    headers = _error_headers(error)
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": error.body()})


def _raw_error(error: GatewayError) -> bytes:
    """`error` as a whole HTTP/1.1 response that closes the connection (below ASGI)."""
    body = error.body()
    head = [b"HTTP/1.1 %d %s" % (error.status_code, HTTPStatus(error.status_code).phrase.encode())]
    head += [name + b": " + value for name, value in _error_headers(error)]
    head += [b"content-length: %d" % len(body), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class _HeadRefused(httptools.HttpParserError):
    """Raised from a parser callback to stop parsing a request we refused."""


def guarded_protocol(limits: LimitsConfig) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the connection-level limits bound in."""
    return type("GuardedHttpToolsProtocol", (_Guarded,), {"limits": limits})


class _Guarded(HttpToolsProtocol):
    """Counts the bytes of each request head (request line + headers) as they arrive and
    times it: from the connection, or from the first byte of a later request on it, to the
    end of the head (idle keep-alive time is uvicorn's `timeout_keep_alive`).
    Over `max_header_bytes` is 431, over `header_timeout_s` 408; either closes the
    connection. A connection over `max_connections` is closed at once with a 503."""

    limits: LimitsConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # raw bytes received since the head began
        self._head_size = 0  # the parsed request line and headers
        self._in_head = True
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.limits.max_connections:
            message = (
                f"the gateway has {self.limits.max_connections} connections open (limits.max_connections)"
            )
            self._refuse(_raw_error(Overloaded(message)))
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes and not self._refused:
            self._refuse_head()

    def _refuse_head(self) -> None:
        message = f"request headers exceed limits.max_header_bytes ({self.limits.max_header_bytes})"
        self._refuse(_raw_error(HeadersTooLarge(message)))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()  # from the first byte of each request (idle keep-alive is not timed here)

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._head_size > self.limits.max_header_bytes:  # a whole head that came in one read
            self._refuse_head()
            raise _HeadRefused  # stops the parser; the app never sees this request
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # after our own refusal the parser's error is ours, not news
            super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._in_head, self._head_bytes, self._head_size = True, 0, 0  # the next request's head

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        if self._in_head and self._head_bytes > 0:
            limit = self.limits.header_timeout_s
            message = f"request headers did not arrive within limits.header_timeout_s ({limit:g}s)"
            self._refuse(_raw_error(ClientTooSlow(message)))
        elif self._in_head:  # an idle connection that never sent a request: just close it
            self.transport.close()

    def _refuse(self, response: bytes) -> None:
        self._in_head, self._refused = False, True
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()
