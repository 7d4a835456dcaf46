"""What every role check takes (tests/contracts/__init__.py says how they run)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.state.roles import StateStore

ROUTES = ("m/a", "m/b")  # the routes every check's stores are built with
POOLS = ("p",)


@dataclass(frozen=True)
class Pair:
    store: StateStore
    peer: StateStore
    sync: Callable[[StateStore], Awaitable[None]]


Check = Callable[[Pair], Awaitable[None]]
