"""Pending prompt tokens in the state store (predicted-TTFT admission, issue 18), against the
memory store and a real redis-server: admitted within `max_pending_tokens` atomically, and no
path (release, first token, cancellation, an expired lease) leaves tokens pending."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from policies.types import PrefillModel
from router.signals.prefill import PrefillLearner
from router.state.memory.store import MemoryStore
from router.state.redis.store import RedisStore
from router.state.roles import StateStore
from router.state.slots import Slots


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        made: StateStore = MemoryStore()
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisStore(url, ["p"], lease_ttl_s=30.0, refresh_s=0.02, flush_s=0.05)
    await made.start()
    try:
        yield made
    finally:
        await made.close()


async def pending(store: StateStore, expected: int) -> None:
    """Poll the snapshot (the Redis store's is refreshed in the background) until it shows it."""
    deadline = asyncio.get_running_loop().time() + 5
    while store.snapshot().pending_prompt_tokens.get("p", 0) != expected:
        assert asyncio.get_running_loop().time() < deadline, store.snapshot().pending_prompt_tokens
        await asyncio.sleep(0.01)


async def test_raced_acquires_are_admitted_within_the_token_budget_exactly(store):
    slots = Slots(64, prompt_tokens=1_000, max_pending_tokens=5_000)
    leases = await asyncio.gather(*(store.leases.try_acquire("p", slots) for _ in range(40)))
    granted = [lease for lease in leases if lease is not None]
    assert len(granted) == 5
    assert sorted(lease.pending_at_admit for lease in granted) == [1_000, 2_000, 3_000, 4_000, 5_000]
    await pending(store, 5_000)
    await store.leases.prefilled(granted[0])
    await store.leases.prefilled(granted[0])  # idempotent
    assert await store.leases.try_acquire("p", slots) is not None  # room for one more prompt
    assert await store.leases.try_acquire("p", slots) is None


async def test_a_lone_prompt_larger_than_the_budget_is_still_admitted(store):
    big = await store.leases.try_acquire("p", Slots(8, prompt_tokens=50_000, max_pending_tokens=5_000))
    assert big is not None and big.pending_at_admit == 50_000
    assert await store.leases.try_acquire("p", Slots(8, prompt_tokens=10, max_pending_tokens=5_000)) is None
    assert await store.leases.try_acquire("p", Slots(8)) is not None  # slots alone ignore the tokens


async def test_no_sequence_of_first_tokens_releases_and_cancellations_leaves_tokens_pending(store):
    rng = random.Random(7)
    slots = Slots(1000, prompt_tokens=100)
    held = []  # every lease a task got: a cancelled holder's is given back below, as on_close does

    async def one() -> None:
        lease = await store.leases.try_acquire("p", slots)
        assert lease is not None
        held.append(lease)
        await asyncio.sleep(rng.random() * 0.01)
        if rng.random() < 0.5:
            await store.leases.prefilled(lease)
        await asyncio.sleep(rng.random() * 0.01)
        await store.leases.release(lease)

    tasks = [asyncio.create_task(one()) for _ in range(200)]
    await asyncio.sleep(0.005)
    for task in rng.sample(tasks, 60):  # cancelled anywhere: in the acquire, holding, releasing
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results)
    assert any(isinstance(r, asyncio.CancelledError) for r in results)
    for lease in held:
        await store.leases.release(lease)  # idempotent for those already released
    await pending(store, 0)  # a cancelled acquire left no tokens behind for a lease nobody holds
    await in_flight(store, 0)  # nor a slot


async def in_flight(store: StateStore, expected: int) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while store.snapshot().in_flight.get("p", 0) != expected:
        assert asyncio.get_running_loop().time() < deadline, store.snapshot().in_flight
        await asyncio.sleep(0.01)


async def test_released_leases_leave_nothing_pending(store):
    leases = [await store.leases.try_acquire("p", Slots(100, prompt_tokens=300)) for _ in range(10)]
    assert all(lease is not None for lease in leases)
    await pending(store, 3_000)
    for lease in leases[:4]:
        await store.leases.prefilled(lease)
    await pending(store, 1_800)
    for lease in leases:
        await store.leases.release(lease)  # after prefilled, or instead of it
    await pending(store, 0)


async def test_an_expired_leases_tokens_stop_counting(redis_url):
    store = RedisStore(redis_url, ["p"], lease_ttl_s=0.2, refresh_s=0.02, flush_s=0.05)
    await store.start()
    try:
        lost = await store.leases.try_acquire("p", Slots(8, prompt_tokens=4_000))
        assert lost is not None
        store.leases._held.clear()  # a replica that died: nobody renews or releases its lease
        await asyncio.sleep(0.3)  # past the lease TTL (Redis's clock decides expiry)
        fresh = await store.leases.try_acquire("p", Slots(8, prompt_tokens=10, max_pending_tokens=100))
        assert fresh is not None and fresh.pending_at_admit == 10
    finally:
        await store.close()


async def test_replicas_sharing_redis_learn_one_prefill_line(redis_url):
    """Each replica measures different requests; after a sync both fit every replica's."""
    prior = {"p": PrefillModel(1_000, 10)}
    stores = [RedisStore(redis_url, ["p"]), RedisStore(redis_url, ["p"])]
    learners = [PrefillLearner(prior, min_samples=20), PrefillLearner(prior, min_samples=20)]
    try:
        line = [(float(tokens), 100 + tokens / 5) for tokens in range(1_000, 31_000, 1_000)]  # 5,000 tok/s
        for tokens, ttft in line[:15]:  # neither replica alone has the 20 samples a fit needs
            learners[0].sample("p", int(tokens), ttft)
        for tokens, ttft in line[15:]:
            learners[1].sample("p", int(tokens), ttft)
        for learner, store in zip(learners, stores, strict=True):
            await learner.sync(store.leases)
        await learners[0].sync(stores[0].leases)  # the first to sync sees the other's on its next sync
        for learner in learners:
            model = learner.models["p"]
            assert model.samples == 30
            assert abs(model.tokens_per_s - 5_000) < 1 and abs(model.overhead_ms - 100) < 0.1
    finally:
        for store in stores:
            await store.close()


async def test_without_the_store_a_replica_learns_from_its_own_and_shares_them_later(redis_url):
    prior = {"p": PrefillModel(1_000, 10)}
    dead = RedisStore("redis://127.0.0.1:9/0", ["p"])  # nothing listens there
    learner = PrefillLearner(prior, min_samples=5)
    try:
        for tokens in range(1_000, 11_000, 1_000):
            learner.sample("p", tokens, 50 + tokens / 2)  # 2,000 tok/s
        await learner.sync(dead.leases)  # unreachable: fits its own
        assert learner.models["p"].samples == 10 and abs(learner.models["p"].tokens_per_s - 2_000) < 1
        alive = RedisStore(redis_url, ["p"])
        try:
            await learner.sync(alive.leases)  # back: the kept measurements are shared now
            other = PrefillLearner(prior, min_samples=5)
            await other.sync(alive.leases)
            assert other.models["p"].samples == 10
        finally:
            await alive.close()
    finally:
        await dead.close()
