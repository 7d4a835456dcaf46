"""Every role's contract (tests/contracts/) on a real redis-server: two stores on one Redis,
as two gateway replicas, the peer's snapshot brought up to date by its refresh; on the
store's own line and on redis-py's client (`state.redis_client`). The memory
half runs in the in-process tier (tests/router/test_role_contracts.py)."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio

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


async def test_an_unreadable_live_percent_reads_as_the_files_in_the_status_as_in_routing(redis_url: str) -> None:
    """A value in Redis that is no number (written by hand, or by another program): the refresh
    skips it, so routing obeys the config file's percent, and the status must say the same."""
    prefix = f"contract-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, POOLS, routes=ROUTES, prefix=prefix)
    await store.start()
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.hset(f"{prefix}:canary", mapping={"m": "lots", "n": "25"})
        await store.refresh()
        assert store.snapshot().canary_percent == {"n": 25.0}
        assert await store.canary.live_canary("m") is None
        assert await store.canary.live_canary("n") == 25.0
    finally:
        await client.aclose()
        await store.close()
