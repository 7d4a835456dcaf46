"""Auto-pipelining (router/state/redis/batch.py) against a real redis-server: commands issued
together share round trips, every caller gets its own reply or error, and a script the server
forgot is loaded again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvloop
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from router.state.latency import ROLLUPS_S, Histogram, Metric, slice_of
from router.state.redis.address import parse_url
from router.state.redis.batch import MAX_BATCH, Batcher
from router.state.redis.keys import Keys
from router.state.redis.store import RedisStore
from router.state.slots import Slots


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def batch(redis_url: str) -> AsyncIterator[Batcher]:
    batch = Batcher(parse_url(redis_url))
    yield batch
    await batch.close()


async def test_commands_issued_together_share_round_trips_and_each_gets_its_reply(batch):
    replies = await asyncio.gather(*(batch.call("INCRBY", "n", i) for i in range(1, 301)))
    assert sorted(replies) == sorted(set(replies))  # each caller saw its own INCRBY's result
    assert max(replies) == sum(range(1, 301))
    assert batch.round_trips == -(-300 // MAX_BATCH)  # 300 commands, 2 round trips


async def test_a_failing_command_fails_its_caller_only(client, batch):
    await client.set("text", "x")
    good = batch.call("INCR", "n")
    bad = batch.call("INCR", "text")  # not an integer
    results = await asyncio.gather(good, bad, return_exceptions=True)
    assert results[0] == 1
    assert isinstance(results[1], ResponseError)


async def test_a_cancelled_caller_leaves_the_others_their_replies(batch):
    calls = [asyncio.create_task(batch.call("INCR", "n")) for _ in range(5)]
    await asyncio.sleep(0)  # all five are queued in the same turn
    calls[2].cancel()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[2], asyncio.CancelledError)
    assert sorted(r for i, r in enumerate(results) if i != 2) == [1, 2, 4, 5]  # the command ran


async def test_every_caller_gets_an_error_when_redis_is_gone():
    batch = Batcher(parse_url("redis://127.0.0.1:1/0"), timeout_s=0.5)
    try:
        results = await asyncio.gather(*(batch.call("PING") for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, RedisError) for r in results), results
    finally:
        await batch.close()


async def test_the_acquire_script_is_loaded_again_after_script_flush(redis_url):
    store = RedisStore(redis_url, ["p"])
    raw = Redis.from_url(redis_url)
    try:
        assert await store.leases.try_acquire("p", Slots(2)) is not None
        await raw.script_flush()  # what a Redis restart or failover does to the script cache
        assert await store.leases.try_acquire("p", Slots(2)) is not None
        assert await store.leases.try_acquire("p", Slots(2)) is None  # still counting: capacity 2
        assert not store.degraded
    finally:
        await raw.aclose()
        await store.close()


@pytest.mark.parametrize("concurrent", [1, 40])
async def test_concurrent_acquires_and_releases_leave_no_lease(redis_url, concurrent):
    store = RedisStore(redis_url, ["p"])
    raw = Redis.from_url(redis_url)
    try:
        leases = await asyncio.gather(*(store.leases.try_acquire("p", Slots(25)) for _ in range(concurrent)))
        granted = [lease for lease in leases if lease is not None]
        assert len(granted) == min(concurrent, 25)
        assert await raw.zcard(store.leases.key("p")) == len(granted)
        await asyncio.gather(*(store.leases.release(lease) for lease in granted))
        assert await raw.zcard(store.leases.key("p")) == 0
    finally:
        await raw.aclose()
        await store.close()


async def test_a_line_that_stops_answering_is_cut_and_the_next_command_reconnects(redis_url):
    admin = Redis.from_url(redis_url)
    batch = Batcher(parse_url(redis_url), timeout_s=0.3)  # the line's watchdog timeout
    try:
        assert await batch.call("PING") == b"PONG"
        await admin.client_pause(1500, all=True)  # Redis holds every client's replies
        started = asyncio.get_running_loop().time()
        results = await asyncio.gather(*(batch.call("INCR", "n") for _ in range(3)), return_exceptions=True)
        waited = asyncio.get_running_loop().time() - started
        assert all(isinstance(r, RedisTimeoutError) for r in results), results
        assert waited < 1.4, waited  # cut by the watchdog, not answered after the pause
        await admin.client_unpause()
        assert await batch.call("INCR", "m") == 1  # a new connection
    finally:
        await batch.close()
        await admin.aclose()


async def test_a_connection_killed_in_flight_fails_its_commands_and_the_line_recovers(redis_url):
    admin = Redis.from_url(redis_url)
    batch = Batcher(parse_url(redis_url))
    try:
        await batch.call("CLIENT", "SETNAME", "line")
        # a blocking command holds the line; killing the connection fails it and the one behind it
        blocked = asyncio.gather(batch.call("BLPOP", "never", 5), batch.call("PING"), return_exceptions=True)
        for _ in range(100):
            if "name=line" in str(await admin.execute_command("CLIENT", "LIST")):
                break
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        results = await asyncio.wait_for(blocked, 3)
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        assert await batch.call("INCR", "k") == 1
    finally:
        await batch.close()
        await admin.aclose()


async def test_a_closed_batcher_sends_what_lingers_first(redis_url):
    client = Redis.from_url(redis_url)
    batch = Batcher(parse_url(redis_url))
    try:
        lazy = asyncio.ensure_future(batch.call("SET", "released", "1", lazy=True))
        await asyncio.sleep(0)  # queued, lingering for company
        await batch.close()
        assert await lazy == b"OK"
        assert await client.get("released") == b"1"
    finally:
        await client.aclose()


def test_the_line_works_on_uvloop_as_served(redis_url):
    """`tidegate serve` runs on uvloop, whose transports are not asyncio's classes: the line
    must take over the socket there too (the other tests run on pytest's asyncio loop)."""

    async def round_trips() -> list[Any]:
        batch = Batcher(parse_url(redis_url))
        try:
            return await asyncio.gather(*(batch.call("INCR", "uv") for _ in range(20)))
        finally:
            await batch.close()

    assert sorted(uvloop.run(round_trips())) == list(range(1, 21))


async def test_the_merge_writes_each_sample_into_its_slice_and_rollups_and_survives_a_script_flush(redis_url):
    """The flush's MERGE calls (one per key, the same on a single Redis and a cluster) leave
    what plain increments of every sample into its 10 s slice, minute and hour would (an
    oracle written here with HINCRBY); after SCRIPT FLUSH the merge loads the script again and
    counts every sample exactly once."""
    scripted = RedisStore(redis_url, ["p"], routes=["m/p"], prefix="scripted")
    raw = Redis.from_url(redis_url)
    keys = Keys("plain")
    try:
        now = time.time()
        samples = [(Metric.E2E, 12.5), (Metric.E2E, 480.0), (Metric.TTFT, 33.0), (Metric.E2E, 12.5)]
        for metric, value in samples:
            scripted.series._book.observe("m/p", metric, value, now)  # observe(), at `now`
            one = Histogram()
            one.add(value)
            for step in ROLLUPS_S:
                key = keys.latency("m/p", metric, slice_of(now, step), step)
                for bucket, count in one.counts.items():
                    await raw.hincrby(key, str(bucket), count)
                await raw.hincrbyfloat(key, Histogram.SUM_FIELD, one.total)
                await raw.hincrbyfloat(key, Histogram.SQUARES_FIELD, one.total_sq)
        scripted.series._counts.add("m/p", {"requests": 2, "cost_usd": 0.25}, now)  # count(), at `now`
        for step in ROLLUPS_S:
            key = keys.counts("m/p", slice_of(now, step), step)
            await raw.hincrbyfloat(key, "requests", 2.0)
            await raw.hincrbyfloat(key, "cost_usd", 0.25)
        await raw.script_flush()  # as after a Redis restart
        await scripted.series.flush()
        written = {k.decode(): k for k in await raw.keys("scripted:*")}
        assert len([k for k in written if ":lat" in k]) == 6  # 2 metrics x 3 rollups
        assert len([k for k in written if ":cnt" in k]) == 3
        for name, key in written.items():
            twin = name.replace("scripted:", "plain:", 1)
            assert _numbers(await raw.hgetall(key)) == _numbers(await raw.hgetall(twin)), name
            assert await raw.ttl(key) > 0
    finally:
        await raw.aclose()
        await scripted.close()


def _numbers(fields: dict[bytes, bytes]) -> dict[bytes, float]:
    return {name: float(value) for name, value in fields.items()}


async def test_a_command_that_cannot_be_packed_fails_its_caller_only(batch):
    results = await asyncio.gather(
        batch.call("INCR", "n"),
        batch.call("SET", "k", None),
        batch.call("INCR", "n"),
        return_exceptions=True,
    )
    assert results[0] == 1 and results[2] == 2
    assert isinstance(results[1], RedisError)


async def test_a_lazy_command_travels_with_the_next_urgent_one_whose_caller_goes_on_first(batch):
    """The last request's release (lazy) and the next one's acquire (urgent) share one round
    trip, and the acquire's caller resumes before the release's."""
    resumed: list[str] = []

    async def send(name: str, lazy: bool) -> None:
        await batch.call("INCR", name, lazy=lazy)
        resumed.append(name)

    await batch.call("PING")
    before = batch.round_trips
    release = asyncio.ensure_future(send("release", True))
    await asyncio.sleep(0)  # the release is queued, lingering
    await send("acquire", False)
    await release
    assert batch.round_trips == before + 1
    assert resumed == ["acquire", "release"]
