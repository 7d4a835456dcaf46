"""Who holds what of one process's connections and request-body budget, so that no single
caller takes more than its share (docs/security.md).

A *holder* is a client key (its caller name, when the request's bearer token is a valid key) or,
without a valid key, the peer's address (behind a trusted proxy, the address the proxy saw).
Each holder may hold at most `limits.max_share_per_caller` of the body budget
(`max_body_bytes_in_flight`) and of the connections (`max_connections`). A trusted proxy's own
connections are shared by the clients behind it and are not counted as one peer's.

One event loop per process: no locks."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable
from enum import StrEnum
from typing import Protocol, runtime_checkable

from router.config import LimitsConfig
from router.errors import GatewayError, Overloaded, RateLimited

# A request holds twice its body's length: the body as it arrived, then the copy that goes
# upstream (router/openai.py UpstreamBody); the two never outlive each other by more than a
# peek, and a hedge's second copy replaces the first body (docs/security.md).
BODY_COPIES = 2


class Refusal(StrEnum):
    """Why a take was refused: the process's whole budget, or the holder's share of it."""

    BUDGET = "budget"
    SHARE = "share"


class Shares:
    def __init__(self, limits: LimitsConfig) -> None:
        self.body_limit = limits.max_body_bytes_in_flight
        self.body_share = max(1, int(limits.max_share_per_caller * limits.max_body_bytes_in_flight))
        # a share of all of them is no share: only the process's own caps apply then
        whole = limits.max_share_per_caller >= 1
        self.connection_share = (
            None if whole else max(1, int(limits.max_share_per_caller * limits.max_connections))
        )
        self.body_held = 0
        self._bodies: dict[str, int] = {}
        self._connections: dict[str, int] = {}

    # --- the body budget ------------------------------------------------------------------

    def take_body(self, holder: str, size: int) -> Refusal | None:
        """Hold `size` bytes for `holder`, or say why not (nothing is taken then)."""
        if self.body_held + size > self.body_limit:
            return Refusal.BUDGET
        held = self._bodies.get(holder, 0)
        if held + size > self.body_share:
            return Refusal.SHARE
        self._bodies[holder] = held + size
        self.body_held += size
        return None

    def give_body(self, holder: str, size: int) -> None:
        left = self._bodies.get(holder, 0) - size
        if left > 0:
            self._bodies[holder] = left
        else:
            self._bodies.pop(holder, None)
        self.body_held -= size

    def body_of(self, holder: str) -> int:
        return self._bodies.get(holder, 0)

    # --- connections ----------------------------------------------------------------------

    def connections_of(self, holder: str) -> int:
        return self._connections.get(holder, 0)

    def join(self, holder: str) -> None:
        self._connections[holder] = self._connections.get(holder, 0) + 1

    def leave(self, holder: str) -> None:
        left = self._connections.get(holder, 0) - 1
        if left > 0:
            self._connections[holder] = left
        else:
            self._connections.pop(holder, None)

    def at_connection_share(self, holder: str) -> bool:
        return self.connection_share is not None and self.connections_of(holder) >= self.connection_share

    def over_connection_share(self, holder: str) -> bool:
        return self.connection_share is not None and self.connections_of(holder) > self.connection_share


class TrustedProxies:
    """The peers whose X-Forwarded-For is believed (`server.forwarded_allow_ips`: IPs, CIDRs or
    `*`), as uvicorn believes them."""

    def __init__(self, allowed: Iterable[str]) -> None:
        entries = list(allowed)
        self._everyone = "*" in entries
        self._networks = [ipaddress.ip_network(e, strict=False) for e in entries if e != "*"]

    def __contains__(self, address: str | None) -> bool:
        if address is None:
            return False
        if self._everyone:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._networks)


def peer_holder(address: str | None) -> str:
    return f"peer:{address or '-'}"


def key_holder(caller: str) -> str:
    return f"key:{caller}"


def forwarded_client(value: bytes) -> str | None:
    """The client a trusted proxy names in X-Forwarded-For: its rightmost entry (the address
    the proxy itself saw)."""
    last = value.rsplit(b",", 1)[-1].strip()
    return last.decode("latin-1") if last else None


def refusal_of(refused: Refusal | None, limits: LimitsConfig) -> GatewayError | None:
    """What the client is told when a body take was refused (None: it was not)."""
    if refused is Refusal.BUDGET:
        return Overloaded(
            "the gateway is reading too many request bodies at once "
            f"(limits.max_body_bytes_in_flight, {limits.max_body_bytes_in_flight} bytes)"
        )
    if refused is Refusal.SHARE:
        return RateLimited(
            "this client holds its share of the request bodies in flight "
            "(limits.max_share_per_caller of limits.max_body_bytes_in_flight); retry shortly"
        )
    return None


@runtime_checkable
class Closable(Protocol):
    """A connection as room is made among them (router/http/connection.py)."""

    idle_since: float | None  # between requests, or before its first: it may be closed
    closing: bool
    holder: str | None

    def close_for_room(self) -> None: ...


def open_count(connections: Collection[object], limit: int) -> int:
    """Connections open and not being closed (a closed one leaves the server's set later);
    counted one by one only past `limit`, where it matters."""
    if len(connections) <= limit:
        return len(connections)
    return sum(1 for c in connections if not (isinstance(c, Closable) and c.closing))


def close_longest_idle(connections: Iterable[object], holder: str | None, but: object) -> bool:
    """Close the connection idle the longest (one of `holder`'s, when given), other than `but`."""
    idle = [
        c
        for c in connections
        if isinstance(c, Closable)
        and c is not but
        and c.idle_since is not None
        and not c.closing
        and (holder is None or c.holder == holder)
    ]
    if not idle:
        return False
    min(idle, key=lambda c: c.idle_since or 0.0).close_for_room()
    return True
