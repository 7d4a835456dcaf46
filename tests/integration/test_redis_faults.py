"""The Redis store under faults a real redis-server can stage: a pause that fails releases
(retried until they land, never left to the lease TTL), a key of the wrong type in one pool
(only that pool decides locally), readiness that makes no Redis call, and a spend cap that
holds across replicas and a leader change."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import redis

from policies.types import Snapshot
from router.app import create_app
from router.config import parse_config
from router.request.upstream import Upstream, aiohttp_transport
from router.spill.keep_warm import KeepWarm
from router.state.redis.store import RedisStore
from router.state.slots import Slots
from tests.conftest import serverless_profile
from tests.servers import Sim, ThreadServer

LEASE_TTL_S = 30.0  # far longer than any deadline below: a lease back in time was released


async def test_releases_that_fail_in_a_redis_pause_land_after_it_not_at_the_lease_ttl(redis_url):
    store = RedisStore(redis_url, ["p"], lease_ttl_s=LEASE_TTL_S, refresh_s=0.05)
    raw = redis.Redis.from_url(redis_url)
    await store.start()
    try:
        leases = [await store.leases.try_acquire("p", Slots(4)) for _ in range(4)]
        assert all(lease is not None for lease in leases) and raw.zcard(store.leases.key("p")) == 4
        raw.execute_command("CLIENT", "PAUSE", 2500, "ALL")
        await asyncio.gather(*(store.leases.release(lease) for lease in leases if lease is not None))
        deadline = time.monotonic() + 10
        while raw.zcard(store.leases.key("p")) != 0:
            assert time.monotonic() < deadline, "released leases still held after the pause"
            await asyncio.sleep(0.05)
        while store.degraded:  # the refresh that failed in the pause comes back
            assert time.monotonic() < deadline, "the store never left its degraded state"
            await asyncio.sleep(0.05)
        lease = await store.leases.try_acquire("p", Slots(4))  # the pool is whole again, and shared
        assert lease is not None and not lease.token.startswith("local:")
    finally:
        raw.execute_command("CLIENT", "UNPAUSE")
        await store.close()
        raw.close()


async def test_a_wrong_type_key_in_one_pool_sends_only_that_pool_local(redis_url, caplog):
    store = RedisStore(redis_url, ["p", "q"], lease_ttl_s=LEASE_TTL_S, refresh_s=0.05)
    raw = redis.Redis.from_url(redis_url)
    raw.set(store.leases.key("p"), "not a sorted set")
    await store.start()
    try:
        broken = await store.leases.try_acquire("p", Slots(4))
        shared = await store.leases.try_acquire("q", Slots(4))
        assert broken is not None and broken.token.startswith("local:")
        assert shared is not None and not shared.token.startswith("local:")
        assert raw.zcard(store.leases.key("q")) == 1 and not store.degraded
        assert any(store.leases.key("p") in r.getMessage() for r in caplog.records)  # says which key
        raw.delete(store.leases.key("p"))
        deadline = time.monotonic() + 10
        while (mended := await store.leases.try_acquire("p", Slots(4))) is None or mended.token.startswith("local:"):
            assert time.monotonic() < deadline, "the pool never went back to shared slots"
            await asyncio.sleep(0.05)
        assert raw.zcard(store.leases.key("p")) == 1
    finally:
        await store.close()
        raw.close()


def connected_clients(raw: redis.Redis) -> int:
    return int(raw.info("clients")["connected_clients"])


def test_readiness_is_served_from_memory_whoever_asks(redis_url):
    text = (
        f"state: {{redis_url: '{redis_url}'}}\nauth: {{allow_anonymous: true}}\n"
        "models:\n  m:\n    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://127.0.0.1:9/v1', model: x}]\n"
    )
    raw = redis.Redis.from_url(redis_url)
    with ThreadServer(create_app(parse_config(text, {}))) as server:
        before = connected_clients(raw)
        answers: list[int] = []

        def ask() -> None:
            answers.append(httpx.get(server.url + "/readyz", timeout=10).status_code)

        threads = [threading.Thread(target=ask) for _ in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
        after = connected_clients(raw)
    raw.close()
    assert answers.count(200) == 100
    assert after - before <= 2  # the store's own connections, not one per asker


async def test_the_keep_warm_budget_holds_across_replicas_and_a_leader_change(redis_url):
    with Sim(serverless_profile()) as sl:
        # a probe costs (8 + 1) tokens x $1/M: the day's budget allows three, for all replicas
        text = (
            f"state: {{redis_url: '{redis_url}', leader_ttl_s: 1}}\nauth: {{allow_anonymous: true}}\n"
            "models:\n  m:\n"
            f"    serverless: [{{name: sl, base_url: '{sl.base_url}', model: s, usd_per_mtok_in: 1, "
            "usd_per_mtok_out: 1, keep_warm: {interval_s: 0.05, max_usd_per_day: 0.000028}}]\n"
        )
        config = parse_config(text, {})
        stores = [RedisStore(redis_url, [], routes=["m/sl"]) for _ in range(2)]
        upstream = Upstream(config.models["m"].endpoints, aiohttp_transport)
        replicas = [KeepWarm(config, s, upstream, lambda: Snapshot(now=0.0), 1.0) for s in stores]
        try:
            for store in stores:
                await store.start()
            deadline = time.monotonic() + 10
            while sl.stats()["requests"] < 3:
                assert time.monotonic() < deadline, sl.stats()
                await replicas[0].tick()
                await asyncio.sleep(0.06)
            # the leader dies (it never resigns); the other takes over once its lease expires
            deadline = time.monotonic() + 10
            while not await stores[1].leadership.lead(replicas[1].token, 1.0, "keep_warm"):
                assert time.monotonic() < deadline, "the other replica never took over"
                await asyncio.sleep(0.1)
            for _ in range(20):
                await replicas[1].tick()
                await asyncio.sleep(0.06)
            assert replicas[1].pings_sent == 0  # the budget was spent by the first replica
            assert sl.stats()["requests"] == 3
        finally:
            for replica in replicas:
                await replica.close()
            for store in stores:
                await store.close()
            await upstream.aclose()
