"""The state-store contract, one module per role (issue 37): each check takes a store, a peer
(another process's store sharing its state: the same object for the memory store, a second
RedisStore on the same Redis for Redis) and `sync`, which brings a peer's snapshot up to date
(a no-op in memory, the refresh on Redis). tests/router/test_role_contracts.py runs every
check on the memory store, in the in-process tier; tests/integration/test_role_contracts.py
runs the same checks on real redis-servers."""

from __future__ import annotations

from tests.contracts import canary, circuits, leadership, members, rankings, spend
from tests.contracts.pair import POOLS, ROUTES, Check, Pair

__all__ = ["POOLS", "ROUTES", "Check", "Pair", "checks"]


def checks() -> list[tuple[str, Check]]:
    """Every role's checks, named `role.check`."""
    found = []
    for module in (circuits, leadership, canary, rankings, spend, members):
        role = module.__name__.rsplit(".", 1)[1]
        found += [(f"{role}.{name}", check) for name, check in vars(module).items() if name.startswith("check_")]
    return found
