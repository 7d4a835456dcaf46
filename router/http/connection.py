"""Connection-level bounds, below HTTP routing and auth: uvicorn's httptools protocol with
every limit a client can push on before any handler runs.

Per connection: at most `max_connections` open (503), a request head (request line and
headers) of at most `max_header_bytes` (431) that arrives within `header_timeout_s` (408).

Per request body, on every path, authenticated or not, before the app sees the request:
- a cap by path: `max_body_bytes` on the proxied `/v1` paths, `max_control_body_bytes` on
  every other path (admin API, feedback, health, unknown paths); a declared Content-Length
  over it is 413 at once, a chunked body is cut when it passes it;
- a process-wide budget, `max_body_bytes_in_flight`: a request holds its declared length
  (a chunked one, what has arrived) from its head until its response is complete; a head
  that does not fit is 503 `server_overloaded` with Retry-After, before any byte is read;
- a deadline, `body_timeout_s` from the end of the head to the end of the body: 408.

A refused request's body is never buffered: once a response is out (the gateway's own
refusal, or the app answering before the body ended: a 401, a 404), what remains of the
body is read and dropped, for at most `discard_timeout_s` and `max_discard_bytes`, then
the connection closes. Clients that write the whole body before they read (openai-node,
curl) then read the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from router.config import LimitsConfig
from router.errors import (
    ClientTooSlow,
    GatewayError,
    HeadersTooLarge,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
)


class BodyBudget:
    """Bytes of request bodies held by this process's requests in flight, at most `limit`.
    One event loop: no lock needed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


def raw_error(error: GatewayError) -> bytes:
    """`error` as a whole HTTP/1.1 response that closes the connection (below ASGI)."""
    body = error.body()
    head = [b"HTTP/1.1 %d %s" % (error.status_code, HTTPStatus(error.status_code).phrase.encode())]
    head.append(b"content-type: application/json")
    if error.retry_after_s is not None:
        head.append(f"retry-after: {error.retry_after_s:g}".encode())
    head += [b"content-length: %d" % len(body), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class _Refused(httptools.HttpParserError):
    """Raised from a parser callback to stop parsing a request we refused."""


def guarded_protocol(limits: LimitsConfig, large_body_paths: frozenset[str]) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the limits bound in. `large_body_paths` take
    `max_body_bytes`; every other path `max_control_body_bytes`. One body budget per call
    (a process serves one gateway)."""
    budget = BodyBudget(limits.max_body_bytes_in_flight)
    namespace = {"limits": limits, "large_body_paths": large_body_paths, "budget": budget}
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), namespace)


class GuardedProtocol(HttpToolsProtocol):
    """See the module docstring. The head is timed from the connection, or from the first byte
    of a later request on it, to its end (idle keep-alive time is uvicorn's
    `timeout_keep_alive`); the body from the end of the head to its end."""

    limits: ClassVar[LimitsConfig]
    large_body_paths: ClassVar[frozenset[str]]
    budget: ClassVar[BodyBudget]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # raw bytes received since the head began
        self._head_size = 0  # the parsed request line and headers
        self._in_head = True
        self._refused = False  # a refusal of ours went out: nothing more is answered here
        self._timer: asyncio.TimerHandle | None = None
        self._body = _BodyState()
        self._holding: dict[RequestResponseCycle, int] = {}  # budget bytes held, per request

    # --- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.limits.max_connections:
            limit = self.limits.max_connections
            self._refuse(Overloaded(f"the gateway has {limit} connections open (limits.max_connections)"))
            return
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        for size in self._holding.values():
            self.budget.give(size)
        self._holding.clear()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes and not self._refused:
            self._refuse_head()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # after our own refusal the parser's error is ours, not news
            super().send_400_response(msg)

    # --- the head -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 0  # each request's head is counted on its own
        self._body = _BodyState()
        self._arm(self.limits.header_timeout_s, self._head_timed_out)  # idle keep-alive is not timed here

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        self._body.read_header(name.lower(), value)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._head_size > self.limits.max_header_bytes:  # a whole head that came in one read
            self._refuse_head()
            raise _Refused  # stops the parser; the app never sees this request
        self._in_head = False
        self._disarm()
        refusal = self._body_refusal()
        if refusal is not None:
            self._answer_and_discard(refusal)
            return  # no ASGI cycle: the app never sees this request
        super().on_headers_complete()
        if self._body.expected:
            self._arm(self.limits.body_timeout_s, self._body_timed_out)
        if self._body.declared:
            self._holding[self.cycle] = self._body.declared

    def _body_refusal(self) -> GatewayError | None:
        body = self._body
        if body.invalid:
            return InvalidRequest("invalid Content-Length header")
        path = httptools.parse_url(self.url).path.decode("latin-1")
        if path in self.large_body_paths:
            body.cap, body.cap_key = self.limits.max_body_bytes, "limits.max_body_bytes"
        else:
            body.cap, body.cap_key = self.limits.max_control_body_bytes, "limits.max_control_body_bytes"
        if body.declared > body.cap:
            return PayloadTooLarge(f"request body of {body.declared} bytes {body.over_cap()}")
        if body.declared and not self.budget.take(body.declared):
            return _budget_spent(self.limits)
        return None

    # --- the body -----------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        state = self._body
        state.received += len(body)
        if state.discarding:
            if state.received > self.limits.max_discard_bytes:
                self._close()
            return
        if not state.declared and not self._hold_more(len(body)):
            return
        if state.received > state.cap:
            self._cut(PayloadTooLarge(f"request body {state.over_cap()}"))
            return
        if self.cycle is not None and self.cycle.response_complete:
            self._discard_rest()  # answered before the body ended: the rest is dropped
            return
        super().on_body(body)

    def _hold_more(self, size: int) -> bool:
        """A chunked body holds budget as it arrives; False when it was cut for that."""
        if not self.budget.take(size):
            self._cut(_budget_spent(self.limits))
            return False
        self._holding[self.cycle] = self._holding.get(self.cycle, 0) + size
        return True

    def on_message_complete(self) -> None:
        self._body.complete = True
        if self._body.discarding:
            self._close()  # the refused body is in: nothing more is served on this connection
            return
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        for cycle in [c for c in self._holding if c.response_complete]:
            self.budget.give(self._holding.pop(cycle))
        body, cycle = self._body, self.cycle
        if cycle is not None and cycle.response_complete and body.expected and not body.complete:
            self._discard_rest()  # answered before its body ended: what is left is dropped
            return
        super().on_response_complete()
        self._in_head, self._head_bytes = True, 0  # what comes next is the next request's head

    # --- refusals -----------------------------------------------------------------------

    def _refuse_head(self) -> None:
        message = f"request headers exceed limits.max_header_bytes ({self.limits.max_header_bytes})"
        self._refuse(HeadersTooLarge(message))

    def _head_timed_out(self) -> None:
        if self._in_head and self._head_bytes > 0:
            limit = self.limits.header_timeout_s
            message = f"request headers did not arrive within limits.header_timeout_s ({limit:g}s)"
            self._refuse(ClientTooSlow(message))
        elif self._in_head:  # an idle connection that never sent a request: just close it
            self._close()

    def _body_timed_out(self) -> None:
        limit = self.limits.body_timeout_s
        error = ClientTooSlow(f"the request body did not arrive within limits.body_timeout_s ({limit:g}s)")
        if self.cycle is not None and not self.cycle.response_started and not self._refused:
            self._silence_app()
            self._refuse(error)
        else:
            self._close()

    def _cut(self, error: GatewayError) -> None:
        """Refuse a request whose body broke a limit while the app may already hold it."""
        if self.cycle is not None and self.cycle.response_started:
            self._discard_rest()  # the app answered already; its answer stands
            return
        self._silence_app()
        self._answer_and_discard(error)

    def _answer_and_discard(self, error: GatewayError) -> None:
        self._refused = True
        self.transport.write(raw_error(error))
        if self._body.expected and not self._body.complete:
            self._discard_rest()
        else:
            self._close()

    def _discard_rest(self) -> None:
        """Read and drop the rest of the body, bounded, then close."""
        state = self._body
        if state.discarding:
            return
        state.discarding = True
        state.received = 0
        self.flow.resume_reading()
        self._arm(self.limits.discard_timeout_s, self._close)

    def _silence_app(self) -> None:
        """The app's later writes for this request are dropped (ours went out instead), and
        its next read of the body says the client is gone."""
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()

    def _refuse(self, error: GatewayError) -> None:
        self._in_head, self._refused = False, True
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(raw_error(error))
            self.transport.close()

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()

    # --- the one timer ------------------------------------------------------------------

    def _arm(self, seconds: float, then: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _BodyState:
    """One request's body as its head declared it and as it arrives."""

    __slots__ = ("cap", "cap_key", "chunked", "complete", "declared", "discarding", "invalid", "received")

    def __init__(self) -> None:
        self.declared = 0  # Content-Length (0: none)
        self.chunked = False
        self.invalid = False
        self.cap = 0
        self.cap_key = ""
        self.received = 0
        self.complete = False
        self.discarding = False

    def read_header(self, name: bytes, value: bytes) -> None:
        if name == b"content-length":
            text = value.strip()
            if not text.isdigit() or (self.declared and int(text) != self.declared):
                self.invalid = True
            else:
                self.declared = int(text)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def over_cap(self) -> str:
        return f"exceeds the limit of {self.cap} bytes ({self.cap_key})"

    @property
    def expected(self) -> bool:
        return self.declared > 0 or self.chunked


def _budget_spent(limits: LimitsConfig) -> Overloaded:
    return Overloaded(
        "the gateway is reading too many request bodies at once "
        f"(limits.max_body_bytes_in_flight, {limits.max_body_bytes_in_flight} bytes)"
    )
