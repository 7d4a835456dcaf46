"""The state-store contract, run against the memory store and a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router.state.base import StateStore
from router.state.memory import MemoryStore
from router.state.redis import RedisStore


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        made: StateStore = MemoryStore()
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisStore(url, ["p", "q"], lease_ttl_s=30.0, refresh_s=0.05)
    await made.start()
    try:
        yield made
    finally:
        await made.close()


async def test_never_grants_more_than_capacity_even_when_raced(store):
    leases = await asyncio.gather(*(store.try_acquire("p", 5) for _ in range(50)))
    granted = [lease for lease in leases if lease is not None]
    assert len(granted) == 5
    assert await store.try_acquire("p", 5) is None


async def test_release_frees_a_slot_and_is_idempotent(store):
    lease = await store.try_acquire("p", 1)
    assert lease is not None
    assert await store.try_acquire("p", 1) is None
    await store.release(lease)
    await store.release(lease)
    again = await store.try_acquire("p", 1)
    assert again is not None
    assert await store.try_acquire("p", 1) is None


async def test_pools_are_independent(store):
    assert await store.try_acquire("p", 1) is not None
    assert await store.try_acquire("q", 1) is not None


async def test_snapshot_reports_leases_held(store):
    for _ in range(3):
        await store.try_acquire("p", 10)
    deadline = asyncio.get_running_loop().time() + 5
    while store.snapshot().in_flight.get("p") != 3:
        assert asyncio.get_running_loop().time() < deadline, store.snapshot()
        await asyncio.sleep(0.01)


async def test_ping(store):
    assert await store.ping() is True


async def test_redis_leases_expire_when_their_holder_stops_renewing(redis_url):
    dead = RedisStore(redis_url, ["p"], lease_ttl_s=0.3)  # never started: never renews
    assert await dead.try_acquire("p", 1) is not None
    alive = RedisStore(redis_url, ["p"], lease_ttl_s=0.3)
    try:
        assert await alive.try_acquire("p", 1) is None
        deadline = asyncio.get_running_loop().time() + 5
        while await alive.try_acquire("p", 1) is None:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
    finally:
        await dead.close()
        await alive.close()


async def test_redis_leases_outlive_their_ttl_while_renewed(redis_url):
    holder = RedisStore(redis_url, ["p"], lease_ttl_s=0.3)
    await holder.start()
    other = RedisStore(redis_url, ["p"], lease_ttl_s=0.3)
    try:
        assert await holder.try_acquire("p", 1) is not None
        for _ in range(10):  # 10 x 0.1 s = three TTLs
            assert await other.try_acquire("p", 1) is None
            await asyncio.sleep(0.1)
    finally:
        await holder.close()
        await other.close()


async def test_redis_unreachable_admits_nothing_and_reports_not_ready():
    store = RedisStore("redis://127.0.0.1:1/0", ["p"])
    try:
        assert await store.try_acquire("p", 1) is None
        assert await store.ping() is False
    finally:
        await store.close()


async def test_redis_store_without_dedicated_pools_still_shares_the_canary(redis_url):
    writer = RedisStore(redis_url, [])
    reader = RedisStore(redis_url, [])
    try:
        await writer.set_canary("m", 40.0)
        await reader.refresh()
        assert reader.snapshot().canary_percent == {"m": 40.0}
        assert reader.snapshot().in_flight == {}
    finally:
        await writer.close()
        await reader.close()
