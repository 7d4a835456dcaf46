"""Every role's contract (tests/contracts/) on the memory store: one process, so the peer is
the store itself. The same checks run on Redis in tests/integration/test_role_contracts.py."""

from __future__ import annotations

import pytest

from router.state.memory.store import MemoryStore
from router.state.roles import StateStore
from tests.contracts import POOLS, ROUTES, Check, Pair, checks

CHECKS = checks()


def test_every_role_module_has_checks() -> None:
    roles = {name.split(".")[0] for name, _ in CHECKS}
    assert roles == {"circuits", "leadership", "canary", "rankings", "spend", "members"}


async def _nothing(_: StateStore) -> None:
    return None


@pytest.mark.parametrize("check", [c for _, c in CHECKS], ids=[n for n, _ in CHECKS])
async def test_the_memory_store_keeps_the_contract(check: Check) -> None:
    assert POOLS  # the memory store needs no pools declared
    store = MemoryStore(ROUTES)
    await store.start()
    try:
        await check(Pair(store, store, _nothing))
    finally:
        await store.close()
