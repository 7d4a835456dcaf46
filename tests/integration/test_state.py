"""The state-store contract, run against the memory store and a real redis-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import RedisError

from router.errors import StoreUnavailable
from router.state.latency import Metric
from router.state.memory.store import MemoryStore
from router.state.redis.scripts import ACQUIRE, REMOVE
from router.state.redis.store import RedisStore
from router.state.roles import StateStore, StoreUnreachableAtStart
from router.state.slots import Slots


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        made: StateStore = MemoryStore(["m/a"])
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisStore(url, ["p", "q"], routes=["m/a"], lease_ttl_s=30.0, refresh_s=0.05, flush_s=0.05)
    await made.start()
    try:
        yield made
    finally:
        await made.close()


async def test_never_grants_more_than_capacity_even_when_raced(store):
    leases = await asyncio.gather(*(store.leases.try_acquire("p", Slots(5)) for _ in range(50)))
    granted = [lease for lease in leases if lease is not None]
    assert len(granted) == 5
    assert await store.leases.try_acquire("p", Slots(5)) is None


async def test_release_frees_a_slot_and_is_idempotent(store):
    lease = await store.leases.try_acquire("p", Slots(1))
    assert lease is not None
    assert await store.leases.try_acquire("p", Slots(1)) is None
    await store.leases.release(lease)
    await store.leases.release(lease)
    again = await store.leases.try_acquire("p", Slots(1))
    assert again is not None
    assert await store.leases.try_acquire("p", Slots(1)) is None


async def test_pools_are_independent(store):
    assert await store.leases.try_acquire("p", Slots(1)) is not None
    assert await store.leases.try_acquire("q", Slots(1)) is not None


async def test_snapshot_reports_leases_held(store):
    for _ in range(3):
        await store.leases.try_acquire("p", Slots(10))
    deadline = asyncio.get_running_loop().time() + 5
    while store.snapshot().in_flight.get("p") != 3:
        assert asyncio.get_running_loop().time() < deadline, store.snapshot()
        await asyncio.sleep(0.01)


async def poll(check, what: str, timeout_s: float = 5.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (result := check()):
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)
    return result


async def test_waiters_are_admitted_in_arrival_order(store):
    holder = await store.leases.try_acquire("p", Slots(1))
    assert holder is not None
    order: list[int] = []

    async def wait_in_line(i: int) -> None:
        lease = await store.leases.try_acquire("p", Slots(1), wait_s=10.0)
        assert lease is not None
        order.append(i)
        await store.leases.release(lease)

    waiters = []
    for i in range(4):
        waiters.append(asyncio.create_task(wait_in_line(i)))
        await poll(lambda i=i: store.snapshot().waiting.get("p", 0) == i + 1, f"waiter {i} queued")
    await store.leases.release(holder)
    await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert order == [0, 1, 2, 3]


async def test_a_newcomer_does_not_jump_the_line(store):
    holder = await store.leases.try_acquire("p", Slots(1))
    waiter = asyncio.create_task(store.leases.try_acquire("p", Slots(1), wait_s=10.0))
    await poll(lambda: store.snapshot().waiting.get("p") == 1, "waiter queued")
    await store.leases.release(holder)
    # the slot is free, but it is the waiter's: a newcomer without patience gets nothing
    newcomer = await store.leases.try_acquire("p", Slots(1))
    lease = await asyncio.wait_for(waiter, 10)
    assert lease is not None
    assert newcomer is None


async def test_a_wait_ends_empty_handed_at_its_deadline_and_leaves_the_line(store):
    assert await store.leases.try_acquire("p", Slots(1)) is not None
    assert await store.leases.try_acquire("p", Slots(1), wait_s=0.05) is None
    await poll(lambda: store.snapshot().waiting.get("p", 0) == 0, "line empty again")


async def test_a_cancelled_waiter_leaves_the_line_and_holds_no_slot(store):
    holder = await store.leases.try_acquire("p", Slots(1))
    waiter = asyncio.create_task(store.leases.try_acquire("p", Slots(1), wait_s=10.0))
    await poll(lambda: store.snapshot().waiting.get("p") == 1, "waiter queued")
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    # well before a forgotten waiter would go stale (1 s): the line must be empty already
    await poll(lambda: store.snapshot().waiting.get("p", 0) == 0, "cancelled waiter left", 0.5)
    await store.leases.release(holder)
    assert await store.leases.try_acquire("p", Slots(1)) is not None


async def test_observed_latency_reaches_the_window_figures(store):
    for value in (100.0, 200.0, 300.0, 400.0):
        store.series.observe("m/a", Metric.TTFT, value)
    store.series.observe("m/a", Metric.E2E, 1000.0)

    async def settled() -> bool:
        windows = await store.series.latency_window(["m/a"], Metric.TTFT, 60)
        return windows["m/a"].samples == 4

    deadline = asyncio.get_running_loop().time() + 5
    while not await settled():
        assert asyncio.get_running_loop().time() < deadline, "samples never reached the store"
        await asyncio.sleep(0.02)
    figures = await poll(lambda: store.snapshot().ttft.get("m/a"), "figures in the snapshot")
    assert figures.samples == 4
    assert figures.mean == 250.0
    assert store.snapshot().e2e["m/a"].samples == 1


async def test_ping(store):
    assert await store.ping() is True


async def test_redis_leases_expire_when_their_holder_stops_renewing(redis_url):
    dead = RedisStore(redis_url, ["p"], lease_ttl_s=0.3)  # never started: never renews
    assert await dead.leases.try_acquire("p", Slots(1)) is not None
    alive = RedisStore(redis_url, ["p"], lease_ttl_s=0.3)
    try:
        assert await alive.leases.try_acquire("p", Slots(1)) is None
        deadline = asyncio.get_running_loop().time() + 5
        while await alive.leases.try_acquire("p", Slots(1)) is None:
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
        assert await holder.leases.try_acquire("p", Slots(1)) is not None
        for _ in range(10):  # 10 x 0.1 s = three TTLs
            assert await other.leases.try_acquire("p", Slots(1)) is None
            await asyncio.sleep(0.1)
    finally:
        await holder.close()
        await other.close()


async def test_redis_unreachable_falls_back_to_a_share_of_each_pool_locally():
    store = RedisStore("redis://127.0.0.1:1/0", ["p"], fallback_share=0.5)
    try:
        leases = [await store.leases.try_acquire("p", Slots(4)) for _ in range(3)]
        assert [lease is not None for lease in leases] == [True, True, False]  # 50% of 4
        assert store.degraded and store.fallback_admissions == 2
        assert store.snapshot().in_flight == {"p": 2}
        assert await store.ping() is False
        await store.leases.release(leases[0])
        assert await store.leases.try_acquire("p", Slots(4)) is not None
    finally:
        await store.close()


async def test_redis_store_recovers_by_itself_when_redis_comes_back(redis_url):
    store = RedisStore(redis_url, ["p"], fallback_share=0.5)
    try:
        store._link.degrade(RedisError("simulated outage"))
        local = await store.leases.try_acquire("p", Slots(4))
        assert local is not None and local.token.startswith("local:")
        await store.refresh()  # the background refresh reaches Redis again
        assert not store.degraded
        shared = await store.leases.try_acquire("p", Slots(4))
        assert shared is not None and not shared.token.startswith("local:")
        await store.leases.release(local)  # a local lease is released locally, not in Redis
        assert await store._link.batch.call("ZCARD", store.leases.key("p")) == 1
    finally:
        await store.close()


async def test_a_canary_write_without_redis_is_a_clear_503_error():
    store = RedisStore("redis://127.0.0.1:1/0", [])
    try:
        with pytest.raises(StoreUnavailable, match="Redis is unreachable"):
            await store.canary.set_canary("m", 10)
    finally:
        await store.close()


async def test_redis_store_without_dedicated_pools_still_shares_the_canary(redis_url):
    writer = RedisStore(redis_url, [])
    reader = RedisStore(redis_url, [])
    try:
        await writer.canary.set_canary("m", 40.0)
        await reader.refresh()
        assert reader.snapshot().canary_percent == {"m": 40.0}
        assert reader.snapshot().in_flight == {}
        await writer.canary.clear_canary("m")  # `canary reset`: every replica back to the file's
        assert writer.snapshot().canary_percent == {}
        await reader.refresh()
        assert reader.snapshot().canary_percent == {}
    finally:
        await writer.close()
        await reader.close()


async def test_redis_latency_merges_samples_from_every_replica(redis_url):
    a = RedisStore(redis_url, [], routes=["m/a"])
    b = RedisStore(redis_url, [], routes=["m/a"])
    try:
        for v in range(1, 101):
            (a if v % 2 else b).series.observe("m/a", Metric.TTFT, float(v))
        await a.series.flush()
        await b.series.flush()
        merged = (await a.series.latency_window(["m/a"], Metric.TTFT, 60))["m/a"]
        figures = merged.figures()
        assert figures is not None
        assert figures.samples == 100
        assert abs(figures.p95 - 95) <= 0.02 * 95
        assert figures.mean == 50.5
    finally:
        await a.close()
        await b.close()


async def test_redis_drops_a_waiter_whose_replica_stopped_polling(redis_url):
    dead = RedisStore(redis_url, ["p"])
    alive = RedisStore(redis_url, ["p"])
    try:
        holder = await alive.leases.try_acquire("p", Slots(1))
        # a waiter that joins the line once and then never polls again (its replica died)
        keys = dead._link.keys.acquire("p", "ghost")
        raw = Redis.from_url(redis_url)
        assert not await raw.eval(ACQUIRE, len(keys), *keys, 1, "ghost", 30000, "1", 1000, 1, 64, 0, -1)
        await raw.aclose()
        await alive.leases.release(holder)
        lease = await alive.leases.try_acquire("p", Slots(1), wait_s=5.0)
        assert lease is not None  # admitted once the ghost went stale, not stuck behind it
    finally:
        await dead.close()
        await alive.close()


@pytest.mark.parametrize("weight", [1, 3])
@pytest.mark.parametrize("wait", ["0", "1"])
async def test_redis_a_removal_that_arrives_before_its_acquire_leaves_nothing(redis_url, weight, wait):
    """A failed acquire's removal and the acquire itself travel on different connections, so
    Redis may run the removal first: the acquire that follows must admit and queue nothing."""
    store = RedisStore(redis_url, ["p"])
    raw = Redis.from_url(redis_url)
    try:
        keys = store._link.keys.acquire("p", "late")
        assert await raw.eval(REMOVE, len(keys), *keys, "late", weight, 30000)
        args = [4, "late", 30000, wait, 1000, weight, 64, 500, -1]
        assert await raw.eval(ACQUIRE, len(keys), *keys, *args) == 0
        assert await raw.zcard(keys[0]) == 0  # no slot
        assert await raw.zcard(keys[1]) == 0  # not in line
        assert int(await raw.get(keys[4]) or 0) == 0  # no pending prompt tokens
        other = store._link.keys.acquire("p", "other")  # the tombstone is that token's alone
        assert await raw.eval(ACQUIRE, len(other), *other, 4, "other", 30000, wait, 1000, 1, 64, 0, -1) == 1
    finally:
        await raw.aclose()
        await store.close()


async def test_a_lease_of_weight_n_holds_n_slots_and_gives_them_all_back(store):
    big = await store.leases.try_acquire("p", Slots(4, weight=3))
    assert big is not None and big.weight == 3
    assert await store.leases.try_acquire("p", Slots(4, weight=2)) is None
    small = await store.leases.try_acquire("p", Slots(4))
    assert small is not None
    await store.leases.release(big)
    assert await store.leases.try_acquire("p", Slots(4, weight=3)) is not None


async def test_a_full_line_is_not_joined(store):
    holder = await store.leases.try_acquire("p", Slots(1, max_waiters=2))
    waiters = [
        asyncio.create_task(store.leases.try_acquire("p", Slots(1, max_waiters=2), wait_s=10.0)) for _ in range(2)
    ]
    await wait_for_line(store, "p", 2)
    assert await store.leases.try_acquire("p", Slots(1, max_waiters=2), wait_s=10.0) is None  # at once: line full
    assert not any(w.done() for w in waiters)
    await store.leases.release(holder)
    # the two joined concurrently, so either may be first in line
    done, pending = await asyncio.wait(waiters, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1 and len(pending) == 1, "exactly one waiter takes the one slot"
    first = done.pop().result()
    assert first is not None
    await store.leases.release(first)
    second = await asyncio.wait_for(pending.pop(), 5)
    assert second is not None


async def wait_for_line(store: StateStore, pool: str, length: int) -> None:
    """Until `length` requests wait in line for `pool` (read from the store itself)."""
    async with asyncio.timeout(5):
        while True:
            if isinstance(store, RedisStore):
                await store.refresh()
            if store.snapshot().waiting.get(pool, 0) >= length:
                return
            await asyncio.sleep(0.01)


async def test_redis_leaves_no_ghost_lease_after_an_acquire_that_timed_out_on_our_side(
    redis_server, redis_url
):
    """Redis stalls past the client's socket timeout; the acquire still runs on the server
    when the stall ends, admitting a token nobody holds. It must be removed, long before
    the lease TTL, and the pool must be whole again."""
    store = RedisStore(redis_url, ["p"], lease_ttl_s=30.0, refresh_s=0.05)
    await store.start()
    stall = redis.Redis(port=redis_server.port, socket_timeout=10)
    sleeper = asyncio.get_running_loop().run_in_executor(None, stall.execute_command, "DEBUG", "SLEEP", "2.5")
    try:
        await asyncio.sleep(0.2)  # not synchronisation: lets the DEBUG SLEEP reach Redis first
        lease = await store.leases.try_acquire("p", Slots(1))
        assert store.degraded  # the acquire timed out on our side: decided locally
        assert lease is not None
        await store.leases.release(lease)
        await sleeper
        checker = redis.Redis(port=redis_server.port)
        deadline = asyncio.get_running_loop().time() + 10
        while checker.zcard(store.leases.key("p")) != 0:
            assert asyncio.get_running_loop().time() < deadline, "a ghost lease is still held"
            await asyncio.sleep(0.05)
        for _ in range(200):  # the background refresh ends the degraded state by itself
            if not store.degraded:
                break
            await asyncio.sleep(0.05)
        assert not store.degraded
        again = await store.leases.try_acquire("p", Slots(1))
        assert again is not None and not again.token.startswith("local:")
    finally:
        await store.close()


async def test_redis_waiters_poll_with_backoff_not_every_10_ms(redis_server, redis_url):
    holder_store = RedisStore(redis_url, ["p"])
    waiting_store = RedisStore(redis_url, ["p"])
    counter = redis.Redis(port=redis_server.port)
    holder = await holder_store.leases.try_acquire("p", Slots(1))
    assert holder is not None
    before = _evalsha_calls(counter)
    results = await asyncio.gather(
        *(waiting_store.leases.try_acquire("p", Slots(1, max_waiters=64), wait_s=1.0) for _ in range(20))
    )
    calls = _evalsha_calls(counter) - before
    await holder_store.close()
    await waiting_store.close()
    assert results == [None] * 20
    # 20 waiters for 1 s at >= 50 ms between polls: at most 20 x (1 + 1 / 0.04) acquires
    assert calls <= 20 * 26, calls


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_redis_refuses_to_start_unreachable_unless_told_to_start_degraded():
    closed = "redis://:secret@127.0.0.1:1/0"
    store = RedisStore(closed, ["p"])
    with pytest.raises(StoreUnreachableAtStart) as caught:
        await store.start()
    await store.close()
    assert "state.redis_url" in str(caught.value) and "secret" not in str(caught.value)
    degraded = RedisStore(closed, ["p"], start_degraded=True)
    await degraded.start()
    try:
        assert degraded.degraded
        assert await degraded.leases.try_acquire("p", Slots(2)) is not None
    finally:
        await degraded.close()


@pytest.mark.parametrize("one_at_a_time", [False, True], ids=["in-a-batch", "one-at-a-time"])
async def test_tasks_still_count_while_redis_is_away_and_say_so_once(caplog, one_at_a_time):
    from router.record.tasks import TaskLedger  # noqa: PLC0415

    store = RedisStore("redis://127.0.0.1:1/0", ["p"], routes=["m/a"])  # nothing listens there
    ledger = TaskLedger(store.tasks, store.series, ttl_s=60)
    ledger.start()
    try:
        for i in range(20):  # all queued before the runner wakes, or each settled alone
            ledger.settle_later(f"t{i}", f"r{i}", "m/a", ok=i % 2 == 0, owner="key-a")
            if one_at_a_time:
                await asyncio.wait_for(ledger.drained(), 30)
        await asyncio.wait_for(ledger.drained(), 30)
        counted = store.series._counts.window("m/a", time.time(), 60)
    finally:
        await ledger.close()
        await store.close()
    assert ledger.untracked == 20
    assert counted == {"tasks": 20, "tasks_ok": 10}
    warnings = [r for r in caplog.records if "not settled in the store" in r.getMessage()]
    assert len(warnings) == 1


async def test_every_replica_reads_when_the_first_one_started(redis_url):
    first = RedisStore(redis_url, [])
    await first.start()
    later = RedisStore(redis_url, [])
    later.started_at = first.started_at + 120  # a replica started two minutes later
    try:
        await later.start()
        assert later.started_at == first.started_at  # reports bill from the gateway's first start
    finally:
        await first.close()
        await later.close()
