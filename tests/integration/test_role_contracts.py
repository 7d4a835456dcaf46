"""Every role's contract (tests/contracts/) on a real redis-server: two stores on one Redis,
as two gateway replicas, the peer's snapshot brought up to date by its refresh; on the
store's own line and on redis-py's client (`state.redis_client`). The memory
half runs in the in-process tier (tests/router/test_role_contracts.py)."""

from __future__ import annotations

import uuid

import pytest

from router.state.redis.store import RedisStore
from router.state.roles import StateStore
from tests.contracts import POOLS, ROUTES, Check, Pair, checks

CHECKS = checks()


async def _refresh(store: StateStore) -> None:
    assert isinstance(store, RedisStore)
    await store.refresh()


@pytest.mark.parametrize("client", ["line", "redis-py"])
@pytest.mark.parametrize("check", [c for _, c in CHECKS], ids=[n for n, _ in CHECKS])
async def test_the_redis_store_keeps_the_contract(check: Check, client: str, redis_url: str) -> None:
    prefix = f"contract-{uuid.uuid4().hex[:8]}"  # each check starts from an empty store
    stores = [RedisStore(redis_url, POOLS, routes=ROUTES, prefix=prefix, client=client) for _ in range(2)]
    for store in stores:
        await store.start()
    try:
        await check(Pair(stores[0], stores[1], _refresh))
    finally:
        for store in stores:
            await store.close()
