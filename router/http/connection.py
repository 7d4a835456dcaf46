"""Connection-level bounds, below HTTP routing and auth: uvicorn's httptools protocol with
every limit a client can push on before any handler runs (docs/security.md has the table).

Per connection: at most `max_connections` open (at the cap the longest-idle one is closed for
a newcomer; with none idle, 503), a head of at most `max_header_bytes` (431) within
`header_timeout_s` (408) of the connection or of a later request's first byte, and only
`keyless_keep_alive_s` of keep-alive after a request without a valid key.

Per request body, on every path, authenticated or not, before the app sees the request:
- a cap by path: `max_body_bytes` on the proxied `/v1` paths, `max_control_body_bytes` on
  every other path; a declared Content-Length over it is 413 at once, a chunked body is cut;
- a process-wide budget, `max_body_bytes_in_flight`: a request holds twice its declared length
  (the body, then the copy sent upstream; a chunked one, what has arrived) from its head until
  its response is complete; a head that does not fit is 503 before any byte is read;
- fair shares (router/http/shares.py): one key, or one address without a key, holds at most
  `max_share_per_caller` of that budget and of the connections (else 429);
- a deadline, `body_timeout_s` from the end of the head to the end of the body: 408.

A refused request's body is never buffered: once a response is out (our refusal, or the app
answering before the body ended: a 401, a 404), the rest is read and dropped, for at most
`discard_timeout_s` and `max_discard_bytes`, then the connection closes, so clients that write
before they read (openai-node, curl) read the answer, not a reset. Every answer written here
is OpenAI-shaped and carries a request id, as the app's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

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
    RateLimited,
)
from router.http.deadline import Deadline
from router.http.heads import BodyState, raw_error
from router.http.shares import (
    BODY_COPIES,
    Shares,
    TrustedProxies,
    close_longest_idle,
    forwarded_client,
    key_holder,
    open_count,
    peer_holder,
    refusal_of,
)


class Callers(Protocol):
    anyone: bool  # the gateway lets anyone in (no keys): every connection is a client's

    def caller_of(self, authorization: bytes) -> str | None:
        """The caller an Authorization header's valid key names; None for no valid key."""


class _NoCallers:
    anyone = True

    def caller_of(self, authorization: bytes) -> str | None:
        return None


def guarded_protocol(
    limits: LimitsConfig,
    large_body_paths: frozenset[str],
    callers: Callers | None = None,
    forwarded_allow_ips: tuple[str, ...] = (),
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the limits bound in. `large_body_paths` take
    `max_body_bytes`; every other path `max_control_body_bytes`. `callers` names the key a
    request's bearer token is (None: every request is its peer's); `forwarded_allow_ips` are the
    proxies whose connections carry many clients. One set of shares per call (a process serves
    one gateway)."""
    namespace = {
        "limits": limits,
        "large_body_paths": large_body_paths,
        "shares": Shares(limits),
        "callers": callers or _NoCallers(),
        "trusted": TrustedProxies(forwarded_allow_ips),
    }
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), namespace)


class GuardedProtocol(HttpToolsProtocol):
    """See the module docstring. The first head is timed from the connection, a later one from
    its first byte (idle keep-alive time is uvicorn's `timeout_keep_alive`, set per connection
    here), each to its end; the body from the end of the head to its end."""

    limits: ClassVar[LimitsConfig]
    large_body_paths: ClassVar[frozenset[str]]
    shares: ClassVar[Shares]
    callers: ClassVar[Callers]
    trusted: ClassVar[TrustedProxies]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # raw bytes received since the head began
        self._in_head = True
        self._heads = 0  # heads begun on this connection (the first is timed from the connection)
        self._refused = False  # a refusal of ours went out: nothing more is answered here
        self._deadline = Deadline(self.loop)
        self._body = BodyState()
        self._holding: dict[RequestResponseCycle, tuple[str, int]] = {}  # per request: holder, bytes
        self.holder: str | None = None  # whose share this connection counts in (None: a trusted proxy's)
        self.idle_since: float | None = None  # between requests (or before the first): may be closed
        self._keyed = False  # the last request had a valid key
        self.closing = False  # closed to make room for another: not counted any more

    # --- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self.idle_since = self.loop.time()
        peer = self.client[0] if self.client else None
        holder = None if peer in self.trusted else peer_holder(peer)
        refusal = self._room_for(holder)
        if refusal is not None:
            self._refuse(refusal)
            return
        self._count_in(holder)
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def _room_for(self, holder: str | None) -> GatewayError | None:
        """Room for one more connection of `holder`: an idle one is closed to make it (the
        holder's own when it is at its share, else anyone's at the process's cap)."""
        limits, shares = self.limits, self.shares
        if holder is not None and shares.at_connection_share(holder) and not self._close_idle(holder):
            return RateLimited(
                f"this client holds {shares.connections_of(holder)} connections, its share "
                "(limits.max_share_per_caller of limits.max_connections)"
            )
        if open_count(
            self.connections, limits.max_connections
        ) > limits.max_connections and not self._close_idle(None):
            return Overloaded(
                f"the gateway has {limits.max_connections} connections open (limits.max_connections)"
            )
        return None

    def _close_idle(self, holder: str | None) -> bool:
        """Close the longest-idle connection (of `holder`, when given) other than this one."""
        return close_longest_idle(self.connections, holder, self)

    def close_for_room(self) -> None:
        """Closed to make room for another connection: no longer counted."""
        self._count_out()
        self.closing = True
        self._close()

    def _count_in(self, holder: str | None) -> None:
        self.holder = holder
        if holder is not None:
            self.shares.join(holder)

    def _count_out(self) -> None:
        if self.holder is not None:
            self.shares.leave(self.holder)
            self.holder = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.stop()
        self._count_out()
        for holder, size in self._holding.values():
            self.shares.give_body(holder, size)
        self._holding.clear()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.idle_since = None
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes and not self._refused:
            self._refuse_head()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what its parser refuses, OpenAI-shaped with a request id like
        every other refusal; after our own refusal the parser's error is ours, not news."""
        if not self._refused:
            self._refuse(InvalidRequest(f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})"))

    # --- the head -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body = BodyState()
        self._heads += 1
        if self._heads > 1:  # the first head's deadline runs from the connection
            self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def on_headers_complete(self) -> None:
        # uvicorn's own callbacks collected the URL and the (lowercased) headers: read them once
        # here rather than hook a Python call into every header (a head that came in one read
        # is checked here; one arriving in pieces in data_received)
        if self._body.read_head(self.url, self.headers) > self.limits.max_header_bytes:
            self._refuse_head()
            raise _Refused  # stops the parser; the app never sees this request
        self._in_head = False
        self._disarm()
        holder = self._request_holder()
        refusal = self._body_refusal(holder)
        if refusal is not None:
            self._answer_and_discard(refusal)
            return  # no ASGI cycle: the app never sees this request
        super().on_headers_complete()
        if self._body.expected:
            self._arm(self.limits.body_timeout_s, self._body_timed_out)
        if self._body.declared:
            self._holding[self.cycle] = (holder, BODY_COPIES * self._body.declared)

    def _request_holder(self) -> str:
        """Whose share this request counts in: its key's, else its peer's (the client a trusted
        proxy names). A keyed request moves its connection into its key's count."""
        body = self._body
        caller = self.callers.caller_of(body.authorization) if body.authorization else None
        self._keyed = caller is not None or self.callers.anyone
        if caller is not None:
            holder = key_holder(caller)
            if self.holder is not None and self.holder != holder:
                self._count_out()
                self._count_in(holder)
            return holder
        if self.holder is None and body.forwarded_for:  # a trusted proxy's client
            return peer_holder(forwarded_client(body.forwarded_for))
        return self.holder or peer_holder(self.client[0] if self.client else None)

    def _body_refusal(self, holder: str) -> GatewayError | None:
        body = self._body
        if body.invalid:
            return InvalidRequest("invalid Content-Length header")
        url = self.url  # origin-form (the usual) is split, not parsed twice: uvicorn parses it too
        raw = url.partition(b"?")[0] if url[:1] == b"/" else httptools.parse_url(url).path
        path = raw.decode("latin-1")
        if path in self.large_body_paths:
            body.cap, body.cap_key = self.limits.max_body_bytes, "limits.max_body_bytes"
        else:
            body.cap, body.cap_key = self.limits.max_control_body_bytes, "limits.max_control_body_bytes"
        if body.declared > body.cap:
            return PayloadTooLarge(f"request body of {body.declared} bytes {body.over_cap()}")
        over = self.holder is not None and self.shares.over_connection_share(self.holder)
        if over and not self._close_idle(self.holder):  # a key's own idle connection goes first
            return RateLimited("this key holds its share of the connections (limits.max_share_per_caller)")
        if body.declared:
            return refusal_of(self.shares.take_body(holder, BODY_COPIES * body.declared), self.limits)
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
        holder, held = self._holding.get(self.cycle, (self._request_holder(), 0))
        refusal = refusal_of(self.shares.take_body(holder, BODY_COPIES * size), self.limits)
        if refusal is not None:
            self._cut(refusal)
            return False
        self._holding[self.cycle] = (holder, held + BODY_COPIES * size)
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
            holder, size = self._holding.pop(cycle)
            self.shares.give_body(holder, size)
        body, cycle = self._body, self.cycle
        if cycle is not None and cycle.response_complete and body.expected and not body.complete:
            self._discard_rest()  # answered before its body ended: what is left is dropped
            return
        limits = self.limits
        # uvicorn's own attribute (typed int, used as call_later's delay): keyless clients idle briefly
        self.timeout_keep_alive = limits.keep_alive_s if self._keyed else limits.keyless_keep_alive_s  # type: ignore[assignment]
        super().on_response_complete()
        self._in_head, self._head_bytes = True, 0  # what comes next is the next request's head
        self.idle_since = self.loop.time()

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

    # --- the one timer (router/http/deadline.py) -----------------------------------------

    def _arm(self, seconds: float, then: Callable[[], None]) -> None:
        self._deadline.arm(seconds, then)

    def _disarm(self) -> None:
        self._deadline.disarm()


class _Refused(httptools.HttpParserError):
    """Raised from a parser callback to stop parsing a request we refused."""
