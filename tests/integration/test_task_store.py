"""The tasks half of the state-store contract (router/record/tasks.py), against the memory store and
a real redis-server: a task belongs to its caller, feedback is applied only by its owner (or
the admin), and failure feedback ahead of its request is kept within a bound per caller that
never displaces a real task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from router.record.tasks import task_name
from router.state.memory.store import MemoryStore
from router.state.redis.store import RedisStore
from router.state.roles import StateStore
from router.state.tasks import EarlyBound, FeedbackResult, Settlement, TaskState

EARLY = EarlyBound(max_per_caller=5, keep_s=60)
A, B = "key-aaaaaaaaaaaa", "key-bbbbbbbbbbbb"


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        made: StateStore = MemoryStore(["m/a"])
    else:
        made = RedisStore(request.getfixturevalue("redis_url"), ["p"], routes=["m/a"])
    await made.start()
    try:
        yield made
    finally:
        await made.close()


def settled(task: str, request: str, route: str, ok: bool = True, owner: str = A) -> Settlement:
    return Settlement(task_name(owner, task, request), request, route, ok, owner)


async def test_a_task_settles_on_its_last_route_and_its_owners_feedback_marks_it_once(store):
    name = task_name(A, "t:t1", "r1")
    assert await store.tasks.settle_task(settled("t:t1", "r1", "m/a"), 60) == TaskState()
    assert await store.tasks.settle_task(settled("t:t1", "r2", "m/b"), 60) == TaskState("m/a", True, False, A)
    by_request = await store.tasks.task_feedback("r2", False, A, 60, EARLY)  # a request finds its task
    assert (by_request.task, by_request.result) == (name, FeedbackResult.APPLIED)
    assert by_request.before == TaskState("m/b", True, False, A)
    again = await store.tasks.task_feedback(name, False, A, 60, EARLY)
    assert again.before == TaskState("m/b", False, True, A)
    # a later request of a failed task does not make it succeed
    assert await store.tasks.settle_task(settled("t:t1", "r3", "m/b"), 60) == TaskState("m/b", False, True, A)


@pytest.mark.parametrize("by", ["request id", "task name"])
async def test_another_key_cannot_judge_a_task_and_the_admin_can(store, by):
    await store.tasks.settle_task(settled("t:t1", "r1", "m/a"), 60)
    await store.tasks.settle_task(settled("r9", "r9", "m/a"), 60)  # a request that is its own task
    key = "r1" if by == "request id" else task_name(A, "t:t1", "r1")
    refused = await store.tasks.task_feedback(key, False, B, 60, EARLY)
    assert refused.result is FeedbackResult.NOT_OWNER
    own = await store.tasks.task_feedback("r9", False, B, 60, EARLY)
    assert own.result is FeedbackResult.NOT_OWNER
    untouched = await store.tasks.task_feedback(key, True, A, 60, EARLY)
    assert untouched.before.ok and not untouched.before.failed  # B's feedback changed nothing
    admin = await store.tasks.task_feedback(key, False, None, 60, EARLY)
    assert admin.result is FeedbackResult.APPLIED and not admin.before.failed


async def test_the_owners_early_failure_is_kept_for_the_settle_and_anothers_is_not(store):
    early = await store.tasks.task_feedback("r1", False, A, 60, EARLY)
    assert early.result is FeedbackResult.KEPT
    assert await store.tasks.settle_task(settled("r1", "r1", "m/a"), 60) == TaskState("", False, True)
    stranger = await store.tasks.task_feedback("r2", False, B, 60, EARLY)
    assert stranger.result is FeedbackResult.KEPT  # B cannot know whose r2 is; kept in B's bound
    before = await store.tasks.settle_task(settled("r2", "r2", "m/a"), 60)
    assert not before.failed  # ... and it never applies to A's request


async def test_early_failure_on_a_request_of_a_named_task_reaches_the_task(store):
    assert (await store.tasks.task_feedback("r5", False, A, 60, EARLY)).result is FeedbackResult.KEPT
    before = await store.tasks.settle_task(settled("t:job", "r5", "m/a"), 60)
    assert before.failed
    after = await store.tasks.task_feedback("r5", True, A, 60, EARLY)
    assert after.task == task_name(A, "t:job", "r5") and after.before.failed


async def test_success_feedback_ahead_of_its_request_keeps_nothing(store):
    found = await store.tasks.task_feedback("r1", True, A, 60, EARLY)
    assert found.result is FeedbackResult.IGNORED
    assert not (await store.tasks.settle_task(settled("r1", "r1", "m/a"), 60)).failed


async def test_early_feedback_is_bounded_per_caller_and_other_callers_are_unaffected(store):
    results = [
        (await store.tasks.task_feedback(f"unknown{i}", False, B, 60, EARLY)).result
        for i in range(EARLY.max_per_caller + 3)
    ]
    assert results.count(FeedbackResult.KEPT) == EARLY.max_per_caller
    assert results[-1] is FeedbackResult.TOO_EARLY
    assert (await store.tasks.task_feedback("mine", False, A, 60, EARLY)).result is FeedbackResult.KEPT


def test_early_feedback_never_displaces_a_real_task_in_the_memory_store():
    store = MemoryStore(max_tasks=1000)
    bound = EarlyBound(max_per_caller=10_000, keep_s=60)

    async def run() -> TaskState:
        await store.tasks.settle_task(settled("t:real", "r0", "m/a"), 60)
        for i in range(5000):
            await store.tasks.task_feedback(f"unknown{i}", False, B, 60, bound)
        return (await store.tasks.task_feedback(task_name(A, "t:real", "r0"), True, A, 60, bound)).before

    assert asyncio.run(run()) == TaskState("m/a", True, False, A)


def test_the_memory_store_tracks_at_most_max_tasks():
    store = MemoryStore(max_tasks=1000)

    async def fill() -> TaskState:
        for i in range(1500):
            await store.tasks.settle_task(settled(f"t{i}", f"r{i}", "m/a"), 60)
        return await store.tasks.settle_task(settled("t0", "r", "m/a"), 60)  # the oldest was dropped

    assert asyncio.run(fill()) == TaskState()
    assert len(store.tasks._tasks) <= 1000


async def test_tasks_and_early_marks_expire(redis_url):
    store = RedisStore(redis_url, ["p"])
    raw = Redis.from_url(redis_url)
    try:
        await store.tasks.settle_task(settled("short", "short", "m/a"), 0.05)
        await store.tasks.task_feedback("gone-soon", False, A, 60, EarlyBound(5, keep_s=0.05))
        deadline = asyncio.get_running_loop().time() + 5
        while await raw.exists(store.tasks.task_key("short"), store.tasks.task_key("gone-soon")):
            assert asyncio.get_running_loop().time() < deadline, "a task key never expired"
            await asyncio.sleep(0.02)
        assert await store.tasks.settle_task(settled("short", "short", "m/a"), 60) == TaskState()
    finally:
        await raw.aclose()
        await store.close()


def arrived(task: str, request: str, route: str, at_ms: int, ok: bool = True) -> Settlement:
    return Settlement(task_name(A, task, request), request, route, ok, A, at_ms)


async def test_a_task_stays_on_the_route_of_its_request_that_arrived_last_whatever_the_settle_order(store):
    """Two gateway replicas settle a task's steps in batches of their own: the step that arrived
    later can be settled first. The earlier step's settle then moves nothing."""
    name = task_name(A, "t:race", "r1")
    assert await store.tasks.settle_task(arrived("t:race", "r2", "m/b", 2_000), 60) == TaskState(
        "", False, False, ""
    )
    late = await store.tasks.settle_task(arrived("t:race", "r1", "m/a", 1_000, ok=False), 60)
    assert (late.route, late.ok, late.failed, late.superseded) == ("m/b", True, False, True)
    found = await store.tasks.task_feedback(name, True, A, 60, EARLY)
    assert (found.before.route, found.before.ok) == ("m/b", True)  # still r2's route and outcome
    newer = await store.tasks.settle_task(arrived("t:race", "r3", "m/a", 3_000), 60)
    assert (newer.route, newer.superseded) == ("m/b", False)  # a later step moves it, as always


async def test_a_superseded_settle_still_lands_its_early_failure_feedback(store):
    name = task_name(A, "t:race", "r1")
    kept = await store.tasks.task_feedback("r1", False, A, 60, EARLY)  # failure ahead of r1's settle
    assert kept.result is FeedbackResult.KEPT
    await store.tasks.settle_task(arrived("t:race", "r2", "m/b", 2_000), 60)
    late = await store.tasks.settle_task(arrived("t:race", "r1", "m/a", 1_000), 60)
    assert (late.route, late.ok, late.failed, late.superseded) == ("m/b", True, True, True)
    found = await store.tasks.task_feedback(name, True, A, 60, EARLY)
    assert (found.before.route, found.before.ok, found.before.failed) == ("m/b", False, True)
