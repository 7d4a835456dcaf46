"""The shared store: dedicated slots as expiring leases in Redis, for many workers/replicas.

Each dedicated pool is a sorted set `tidegate:slots:{pool}` of lease tokens scored by their
expiry (Redis server time, ms). Acquire is one Lua script: drop expired leases, then add one
if fewer than `capacity` remain and nobody waits ahead. A replica renews the leases it holds
every `ttl / 3`, so a replica killed with SIGKILL leaks its slots for at most `lease_ttl_s`.

Waiting for a slot (`wait_s > 0`) is a line shared by every replica: `...:queue:{pool}` holds
waiters by arrival time, `...:seen:{pool}` the time each last polled. A waiter polls with a
jittered backoff from `_POLL_MIN_S` to `_POLL_MAX_S` (and at once when this process releases
a slot of the pool); one that has not polled for `_WAITER_STALE_MS` (its replica died) is
dropped from the line by the next acquire. A line of `max_waiters` is not joined.

An acquire that fails on the client side (a timeout, a cancellation, a lost connection) may
still run on the server, admitting a token nobody holds: every such path removes the token
in the background, retrying until the lease TTL, so no ghost lease outlives the failure. The
removal also leaves a tombstone for the token (`...:gone:{pool}:TOKEN`, one lease TTL) that
the acquire script checks first: the acquire and its removal travel on different connections
(the acquire may still sit in the batcher's next pipeline), so the removal can reach Redis
first, and the acquire arriving after it must then admit nothing.

Every script touches the keys of one pool or one route only (the `{pool}` / `{route}` hash
tags), so the same store runs on a single Redis and on Redis Cluster (`state.redis_cluster`
or a `redis+cluster://` URL).

Latency samples are buffered in-process and merged into Redis in the background every
`flush_s` (HINCRBY into `...:lat:{route}:{metric}:{slice}` hashes, see router/latency.py),
so recording adds no round trip to a request; the merge travels down the request path's
connection (router/state/redis_line.py), lazily, with the next acquire. Each slice expires
after `retention_s`.

On the request path Redis costs exactly two commands: the acquire and the release (and the
task settlement after it). Commands issued in the same event-loop turn share one pipeline
(router/state/redis_batch.py), so under load many requests' acquires and releases share a
round trip; the release and the settlement, which no response waits for, linger up to 2 ms
for the next acquire, so even one request at a time costs about one round trip.
`snapshot()` reads copies that background tasks refresh (pool counts every `refresh_s`,
latency figures every second).

Redis errors never reach a request. When Redis cannot be reached the store is *degraded*:
admission falls back to per-process slots, `fallback_share` of each pool's capacity (size it
as 1 / the number of gateway processes), without trying Redis on the request path; the
snapshot shows those local counts; a release that cannot reach Redis is left to the lease
TTL; latency samples that cannot be flushed are dropped with a warning. The background
refresh keeps trying, and its first success ends the degraded state by itself. Leases taken
locally stay local until released, so right after recovery a pool may briefly hold up to
its capacity plus the local leases still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.exceptions import RedisError, ResponseError

from policies.types import Snapshot
from router.errors import StoreUnavailable
from router.periodic import every
from router.state.base import Lease, Slots, StoreUnreachableAtStart, members, probe_order
from router.state.latency import (
    ROLLUPS_S,
    SLICE_S,
    CountBook,
    Counts,
    Histogram,
    LatencyBook,
    Metric,
    add_counts,
    figures_by_route,
    resolution_for,
    rolled_up,
    rolled_up_counts,
    slice_of,
    slices_in_window,
)
from router.state.memory import MemoryStore
from router.state.redis_batch import Batcher
from router.state.redis_scripts import (
    ACQUIRE,
    CANARY_WRITE,
    CIRCUITS,
    COUNT,
    EARLY_MARK,
    FORGET_PENDING,
    LEAD,
    LINK_REQUEST,
    MERGE,
    REMOVE,
    RENEW,
    SETTLE_TASK,
    SPEND,
    TASK_FEEDBACK,
    TRIP,
)
from router.tasks import EarlyBound, Feedback, FeedbackResult, Settlement, TaskState

log = logging.getLogger("tidegate.state")

_POLL_MIN_S = 0.05  # a waiter's first poll; each next one 1.5x later, up to _POLL_MAX_S (jittered)
_POLL_MAX_S = 0.25
_LOCAL = "local:"  # token prefix of a slot granted while Redis was unreachable
_WAITER_STALE_MS = 1000  # > _POLL_MAX_S x the largest jitter, with room for a slow round trip
_FORGET_EVERY_S = 0.5
_MAX_CONNECTIONS = 32  # per process (per node on a cluster); the request path uses one line
_FINE_TTL_S = 2 * 3600  # 10 s slices serve windows up to an hour; the rollups keep the rest


def _rollup(step_s: int) -> str:
    return "" if step_s == SLICE_S else str(step_s)


def redacted(url: str) -> str:
    """`url` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def connect(url: str, *, cluster: bool) -> Redis | RedisCluster:
    """A client for a single Redis or, with `cluster` (or a `redis+cluster://` URL), a cluster,
    with at most `_MAX_CONNECTIONS` connections (per node): more callers wait for one."""
    options: dict[str, Any] = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
    if "+cluster://" in url:
        url, cluster = url.replace("+cluster://", "://", 1), True
    if cluster:
        return RedisCluster.from_url(url, max_connections=_MAX_CONNECTIONS, **options)
    pool = BlockingConnectionPool.from_url(url, max_connections=_MAX_CONNECTIONS, timeout=2.0, **options)
    return Redis(connection_pool=pool)


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        pools: Iterable[str],
        *,
        routes: Iterable[str] = (),
        lease_ttl_s: float = 30.0,
        refresh_s: float = 0.2,
        flush_s: float = 0.5,
        window_s: float = 60.0,
        retention_s: float = 86400.0,
        fallback_share: float = 0.5,
        prefix: str = "tidegate",
        cluster: bool = False,
        start_degraded: bool = False,
    ) -> None:
        self._url = redacted(url)
        self._redis = connect(url, cluster=cluster)
        self._start_degraded = start_degraded
        self._pools = sorted(set(pools))
        self._routes = sorted(set(routes))
        self._ttl_ms = int(lease_ttl_s * 1000)
        self._refresh_s = refresh_s
        self._flush_s = flush_s
        self._window_s = window_s
        self._retention_s = int(retention_s)
        self._prefix = prefix
        self._canary_key = f"{prefix}:canary"
        self._probe_key = f"{prefix}:probe"
        self._acquire_sha = self._redis.register_script(ACQUIRE).sha
        self._forget_sha = self._redis.register_script(FORGET_PENDING).sha
        self._remove_sha = self._redis.register_script(REMOVE).sha
        self._settle_sha = self._redis.register_script(SETTLE_TASK).sha
        self._link_sha = self._redis.register_script(LINK_REQUEST).sha
        self._feedback_sha = self._redis.register_script(TASK_FEEDBACK).sha
        self._early_sha = self._redis.register_script(EARLY_MARK).sha
        self._spend_sha = self._redis.register_script(SPEND).sha
        self._merge_sha = self._redis.register_script(MERGE).sha
        self._batch = Batcher(self._redis)
        self._trip = self._redis.register_script(TRIP)
        self._fallback_share = fallback_share
        self._local = MemoryStore()  # admission while Redis is unreachable
        self.degraded = False
        self.fallback_admissions = 0  # slots granted locally because Redis was unreachable
        self._held: dict[str, set[str]] = {}
        self._broken: set[str] = set()  # pools whose keys Redis refuses (wrong type): local slots
        self._released: dict[str, asyncio.Event] = {}
        self._book = LatencyBook()
        self._counts = CountBook()
        self._snapshot = Snapshot(now=0.0)
        self._tasks: list[asyncio.Task[None]] = []
        self._cleanups: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()

    def key(self, pool: str) -> str:
        return f"{self._prefix}:slots:{{{pool}}}"

    def _line_keys(self, pool: str) -> list[str]:
        """slots, queue, seen, pending prompt tokens (hash by lease token), their sum."""
        return [
            self.key(pool),
            f"{self._prefix}:queue:{{{pool}}}",
            f"{self._prefix}:seen:{{{pool}}}",
            *self._pending_keys(pool),
        ]

    def _acquire_keys(self, pool: str, token: str) -> list[str]:
        """The pool's line keys and the tombstone `token` gets if its acquire is given up."""
        return [*self._line_keys(pool), f"{self._prefix}:gone:{{{pool}}}:{token}"]

    def _pending_keys(self, pool: str) -> list[str]:
        return [f"{self._prefix}:pending:{{{pool}}}", f"{self._prefix}:pendsum:{{{pool}}}"]

    def breaker_key(self, route: str) -> str:
        return f"{self._prefix}:breaker:{route}"

    def counts_key(self, route: str, start: int, step_s: int = SLICE_S) -> str:
        return f"{self._prefix}:cnt{_rollup(step_s)}:{route}:{start}"

    def latency_key(self, route: str, metric: Metric, start: int, step_s: int = SLICE_S) -> str:
        return f"{self._prefix}:lat{_rollup(step_s)}:{route}:{metric.value}:{start}"

    async def try_acquire(self, pool: str, slots: Slots, wait_s: float = 0.0) -> Lease | None:
        if self.degraded or pool in self._broken:
            return await self._acquire_locally(pool, slots, wait_s)
        token = uuid.uuid4().hex
        keys = self._acquire_keys(pool, token)
        try:
            pending = await self._wait_in_line(pool, keys, slots, token, wait_s)
        except ResponseError as exc:  # Redis is up, but this pool's keys are unusable (WRONGTYPE)
            self._break(pool, exc)
            return await self._acquire_locally(pool, slots, wait_s)
        except RedisError as exc:
            self._forget_later(keys, token, slots.weight)
            self._degrade(exc)
            return await self._acquire_locally(pool, slots, wait_s)
        except BaseException:
            self._forget_later(keys, token, slots.weight)
            raise
        if pending is None:
            return None
        self._held.setdefault(pool, set()).update(members(token, slots.weight))
        return Lease(pool, token, slots.weight, slots.prompt_tokens, pending)

    async def _wait_in_line(
        self, pool: str, keys: list[str], slots: Slots, token: str, wait_s: float
    ) -> int | None:
        """Acquire, polling with a jittered backoff while allowed to wait; once admitted, the
        pool's pending prompt tokens (None: not admitted)."""
        deadline = time.monotonic() + wait_s
        wait = "1" if wait_s > 0 else "0"
        args: list[str | int] = [slots.capacity, token, self._ttl_ms, wait, _WAITER_STALE_MS]
        limit = -1 if slots.max_pending_tokens is None else slots.max_pending_tokens
        args += [slots.weight, slots.max_waiters, slots.prompt_tokens, limit]
        pause = _POLL_MIN_S
        while True:
            answer = int(await self._batch.call_script(self._acquire_sha, ACQUIRE, keys, args))
            if answer >= 1:
                return answer - 1
            remaining = deadline - time.monotonic()
            if answer < 0 or remaining <= 0:  # the line is full, or the wait is over
                if wait_s > 0:  # out of the line (it holds no slot: removing none is a no-op)
                    await self._remove(keys, token, slots.weight)
                return None
            await self._pause(pool, min(pause * random.uniform(0.8, 1.2), remaining))
            pause = min(pause * 1.5, _POLL_MAX_S)

    async def _acquire_locally(self, pool: str, slots: Slots, wait_s: float) -> Lease | None:
        local = replace(slots, capacity=max(1, int(slots.capacity * self._fallback_share)))
        lease = await self._local.try_acquire(pool, local, wait_s)
        if lease is None:
            return None
        self.fallback_admissions += 1
        return Lease(pool, _LOCAL + lease.token, lease.weight)

    def _break(self, pool: str, exc: RedisError) -> None:
        """One pool falls back to local slots; the others stay shared. The refresh mends it
        when the pool's keys answer again."""
        if pool not in self._broken:
            log.error(
                "state store: the keys of pool %s are unusable (%s); this pool decides locally "
                "(fallback_share) until they are fixed, e.g. DEL %s",
                pool,
                exc,
                " ".join(self._line_keys(pool)),
            )
        self._broken.add(pool)

    def _degrade(self, exc: RedisError) -> None:
        if not self.degraded:
            log.warning("state store: Redis unreachable, deciding locally until it is back: %s", exc)
        self.degraded = True

    async def _remove(self, keys: list[str], token: str, weight: int) -> None:
        """`token` out of the pool's slots (all `weight` members), its line and its pending
        tokens, and marked gone so that its acquire, wherever it still is, admits nothing."""
        await self._batch.call_script(self._remove_sha, REMOVE, keys, [token, weight, self._ttl_ms])

    def _forget_later(self, keys: list[str], token: str, weight: int) -> None:
        """An acquire that failed on our side may still run (or have run) on the server,
        admitting or queueing `token`: remove it from the slots and the line in the
        background, retrying until the lease would have expired anyway. The removal may reach
        Redis before the acquire it undoes: its tombstone makes that acquire admit nothing."""

        async def forget() -> None:
            give_up = time.monotonic() + self._ttl_ms / 1000
            while True:
                try:
                    await self._remove(keys, token, weight)
                    return
                except RedisError:
                    if time.monotonic() > give_up or self._stopping.is_set():
                        return
                    await asyncio.sleep(_FORGET_EVERY_S)

        task = asyncio.get_running_loop().create_task(forget())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _pause(self, pool: str, seconds: float) -> None:
        """Sleep until the next poll, or less if this process releases a slot of the pool."""
        released = self._released.setdefault(pool, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(released.wait(), seconds)

    async def release(self, lease: Lease) -> None:
        if lease.token.startswith(_LOCAL):
            await self._local.release(Lease(lease.pool, lease.token.removeprefix(_LOCAL), lease.weight))
            return
        held = members(lease.token, lease.weight)
        self._held.get(lease.pool, set()).difference_update(held)
        key = self.key(lease.pool)
        try:
            if lease.prompt_tokens > 0:
                slots = self._batch.call("ZREM", key, *held, lazy=True)
                await asyncio.gather(slots, self._forget(lease))  # one pipeline
            else:
                await self._batch.call("ZREM", key, *held, lazy=True)
        except RedisError as exc:  # retried (idempotent, with the removal's tombstone) until it lands
            log.warning("state store: release on %s failed, retrying until it lands: %s", lease.pool, exc)
            self._forget_later(self._acquire_keys(lease.pool, lease.token), lease.token, lease.weight)
        released = self._released.pop(lease.pool, None)
        if released is not None:
            released.set()

    async def prefilled(self, lease: Lease) -> None:
        if lease.token.startswith(_LOCAL):
            await self._local.prefilled(Lease(lease.pool, lease.token.removeprefix(_LOCAL), lease.weight))
            return
        if lease.prompt_tokens <= 0:
            return
        try:
            await self._forget(lease)
        except RedisError as exc:
            log.warning("state store: prefill end on %s lost (release clears it): %s", lease.pool, exc)

    async def _forget(self, lease: Lease) -> None:
        keys = self._pending_keys(lease.pool)
        await self._batch.call_script(self._forget_sha, FORGET_PENDING, keys, [lease.token], lazy=True)

    async def prefill_samples(
        self, pool: str, new: Sequence[tuple[float, float]], keep: int
    ) -> list[tuple[float, float]]:
        """One list per pool (`...:prefill:{pool}`) that every replica appends to and trims to
        `keep`; it expires a day after its last write."""
        key = f"{self._prefix}:prefill:{{{pool}}}"
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                if new:
                    pipe.rpush(key, *(f"{tokens:g}:{ttft_ms:.3f}" for tokens, ttft_ms in new))
                    pipe.ltrim(key, -keep, -1)
                    pipe.expire(key, 86400)
                pipe.lrange(key, 0, -1)
                *_, found = await pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"the prefill samples could not be shared ({exc})") from exc
        samples = []
        for raw in found:
            tokens, _, ttft = (raw.decode() if isinstance(raw, bytes) else str(raw)).partition(":")
            with contextlib.suppress(ValueError):
                samples.append((float(tokens), float(ttft)))
        return samples

    def canary_keys(self, model: str) -> list[str]:
        """The leader lease, a model's run and its history: one hash slot ({canary})."""
        tag = f"{self._prefix}:{{canary}}"
        return [f"{tag}:leader", f"{tag}:run:{model}", f"{tag}:history:{model}"]

    def _leader_key(self, role: str) -> str:
        """The canary controller's lease shares the {canary} hash slot with the runs it fences."""
        return self.canary_keys("")[0] if role == "canary" else f"{self._prefix}:leader:{role}"

    async def lead(self, token: str, ttl_s: float, role: str = "canary") -> bool:
        key = self._leader_key(role)
        try:
            return bool(await self._redis.eval(LEAD, 1, key, token, int(ttl_s * 1000)))
        except RedisError as exc:
            raise StoreUnavailable(f"the leader lease could not be checked ({exc})") from exc

    async def resign(self, token: str, role: str = "canary") -> None:
        key = self._leader_key(role)
        with contextlib.suppress(RedisError):
            if await self._redis.get(key) == token.encode():
                await self._redis.delete(key)

    async def canary_run(self, model: str) -> tuple[int, bytes | None]:
        try:
            found = await self._redis.hmget(self.canary_keys(model)[1], ["version", "json"])
        except RedisError as exc:
            raise StoreUnavailable(f"the canary run could not be read ({exc})") from exc
        version, run = found
        return int(version or 0), run.encode() if isinstance(run, str) else run

    async def canary_history(self, model: str, limit: int) -> list[bytes]:
        try:
            found = await self._redis.lrange(self.canary_keys(model)[2], 0, limit - 1)
            return [e if isinstance(e, bytes) else str(e).encode() for e in found]
        except RedisError as exc:
            raise StoreUnavailable(f"the canary history could not be read ({exc})") from exc

    async def write_canary(
        self, model: str, run: bytes, event: bytes | None, *, version: int, leader: str | None, history: int
    ) -> int:
        args: list[str | bytes | int] = [leader or "", run, event or b"", history, version]
        try:
            return int(await self._redis.eval(CANARY_WRITE, 3, *self.canary_keys(model), *args))
        except RedisError as exc:
            raise StoreUnavailable(f"the canary run could not be written ({exc})") from exc

    async def try_spend(self, ledger: str, usd: float, cap_usd: float, ttl_s: float) -> bool:
        key = f"{self._prefix}:spend:{{{ledger}}}"
        args = [repr(usd), repr(cap_usd), int(ttl_s * 1000)]
        try:
            return int(await self._batch.call_script(self._spend_sha, SPEND, [key], args)) == 1
        except RedisError as exc:
            raise StoreUnavailable(f"the spend of {ledger} could not be counted ({exc})") from exc

    def task_key(self, task: str) -> str:
        """A task's hash, or a request's (its own task, or a pointer to its named task)."""
        return f"{self._prefix}:task:{{{task}}}"

    async def settle_task(self, settled: Settlement, ttl_s: float) -> TaskState:
        ttl_ms = int(ttl_s * 1000)
        marked = False
        if settled.task != settled.request:  # the request points at its task, for feedback
            args = [settled.task, ttl_ms, settled.owner]
            key = self.task_key(settled.request)
            marked = (
                int(await self._batch.call_script(self._link_sha, LINK_REQUEST, [key], args, lazy=True)) == 1
            )
        ok, failed = "1" if settled.ok else "0", "1" if marked else "0"
        args = [settled.route, ok, ttl_ms, settled.owner, failed]
        key = self.task_key(settled.task)
        before = await self._batch.call_script(self._settle_sha, SETTLE_TASK, [key], args, lazy=True)
        return _task_state(before)

    async def task_feedback(
        self, key: str, ok: bool, caller: str | None, ttl_s: float, early: EarlyBound
    ) -> Feedback:
        try:
            return await self._feedback(key, ok, caller, int(ttl_s * 1000), early)
        except RedisError as exc:
            raise StoreUnavailable(f"the feedback could not be stored: Redis is unreachable ({exc})") from exc

    async def _feedback(
        self, task: str, ok: bool, caller: str | None, ttl_ms: int, early: EarlyBound
    ) -> Feedback:
        """Follow a request to its task, apply, or keep an early failure (bounded per caller:
        a counter per `early.keep_s` window, so at most twice the bound across a boundary)."""
        for _ in range(4):  # a request moves once; a task settled meanwhile is applied next turn
            args = ["1" if ok else "0", ttl_ms, caller or ""]
            kind, *rest = await self._batch.call_script(
                self._feedback_sha, TASK_FEEDBACK, [self.task_key(task)], args
            )
            kind = _text(kind)
            if kind == "moved":
                task = _text(rest[-1])
                continue
            if kind != "unsettled":
                result = FeedbackResult.APPLIED if kind == "applied" else FeedbackResult.NOT_OWNER
                return Feedback(task, _task_state(rest), result)
            if ok or caller is None:
                return Feedback(task, TaskState(), FeedbackResult.IGNORED)
            if not await self._early_allowed(caller, early):
                return Feedback(task, TaskState(), FeedbackResult.TOO_EARLY)
            keep_ms = int(early.keep_s * 1000)
            mark, target = await self._batch.call_script(
                self._early_sha, EARLY_MARK, [self.task_key(task)], [caller, keep_ms]
            )
            if _text(mark) == "kept":
                return Feedback(task, TaskState(), FeedbackResult.KEPT)
            task = _text(target) or task
        raise StoreUnavailable(f"the feedback on {task} kept racing its settlement; try again")

    async def _early_allowed(self, caller: str, early: EarlyBound) -> bool:
        window = int(time.time() // early.keep_s)
        key = f"{self._prefix}:early:{{{caller}}}:{window}"
        kept = await self._batch.call("INCR", key)
        if int(kept) == 1:
            await self._batch.call("PEXPIRE", key, int(early.keep_s * 2000), lazy=True)
        return int(kept) <= early.max_per_caller

    def observe(self, route: str, metric: Metric, value_ms: float) -> None:
        self._book.observe(route, metric, value_ms, time.time())

    def count(self, route: str, counts: Mapping[str, float]) -> None:
        self._counts.add(route, counts, time.time())

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]:
        windows: dict[str, Counts] = {}
        for route, slices in (await self._window_slices(routes, window_s, self.counts_key)).items():
            merged: Counts = {}
            for fields in slices:
                add_counts(merged, {k.decode(): float(v) for k, v in fields.items()})
            windows[route] = merged
        return windows

    async def counts_series(
        self, routes: Sequence[str], window_s: float
    ) -> tuple[int, dict[str, list[tuple[int, Counts]]]]:
        step = resolution_for(window_s)
        starts = list(slices_in_window(time.time(), window_s, step))
        series: dict[str, list[tuple[int, Counts]]] = {}
        for route, slices in (await self._window_slices(routes, window_s, self.counts_key)).items():
            series[route] = [
                (start, {k.decode(): float(v) for k, v in fields.items()})
                for start, fields in zip(starts, slices, strict=True)
            ]
        return step, series

    def snapshot(self) -> Snapshot:
        if self.degraded:
            local = self._local.snapshot()
            return replace(
                self._snapshot,
                now=local.now,
                in_flight=local.in_flight,
                waiting=local.waiting,
                pending_prompt_tokens=local.pending_prompt_tokens,
            )
        if self._broken:  # those pools' slots are local: so are their counts
            local = self._local.snapshot()
            shared = self._snapshot
            return replace(
                shared,
                now=local.now,
                in_flight={**shared.in_flight, **_only(local.in_flight, self._broken)},
                waiting={**shared.waiting, **_only(local.waiting, self._broken)},
                pending_prompt_tokens={
                    **shared.pending_prompt_tokens,
                    **_only(local.pending_prompt_tokens, self._broken),
                },
            )
        return replace(self._snapshot, now=time.monotonic())

    async def set_probe(self, model: str, ranking: bytes) -> None:
        try:
            await self._redis.hset(self._probe_key, model, ranking)
        except RedisError as exc:
            raise StoreUnavailable(
                f"the probe ranking could not be stored: Redis is unreachable ({exc})"
            ) from exc
        orders = {**self._snapshot.probe_order, model: probe_order(ranking)}
        self._snapshot = replace(self._snapshot, probe_order=orders)

    async def probe(self, model: str) -> bytes | None:
        try:
            found = await self._redis.hget(self._probe_key, model)
        except RedisError as exc:
            raise StoreUnavailable(f"the probe ranking could not be read ({exc})") from exc
        return found.encode() if isinstance(found, str) else found

    async def set_canary(self, model: str, percent: float) -> None:
        try:
            await self._redis.hset(self._canary_key, model, str(percent))
        except RedisError as exc:
            raise StoreUnavailable(f"the canary could not be stored: Redis is unreachable ({exc})") from exc
        self._snapshot = replace(
            self._snapshot, canary_percent={**self._snapshot.canary_percent, model: percent}
        )

    async def trip(self, route: str, cooldown_s: float, max_cooldown_s: float) -> float:
        args = [int(cooldown_s * 1000), int(max_cooldown_s * 1000)]
        try:
            left_ms = int(await self._trip(keys=[self.breaker_key(route)], args=args))
        except RedisError as exc:
            raise StoreUnavailable(f"the circuit of {route} could not be opened ({exc})") from exc
        circuits = {**self._snapshot.circuit_open, route: time.monotonic() + left_ms / 1000}
        self._snapshot = replace(self._snapshot, circuit_open=circuits)
        return left_ms / 1000

    async def reset_circuit(self, route: str) -> None:
        try:
            await self._redis.delete(self.breaker_key(route))
        except RedisError as exc:
            raise StoreUnavailable(f"the circuit of {route} could not be closed ({exc})") from exc
        circuits = {k: v for k, v in self._snapshot.circuit_open.items() if k != route}
        self._snapshot = replace(self._snapshot, circuit_open=circuits)

    async def refresh(self) -> None:
        """Read every pool's live lease and waiter counts, the canary overrides and the open
        circuits (one round trip). The snapshot is replaced, never mutated, so readers need no
        copy. Failing marks the store degraded; succeeding ends that."""
        try:
            await self._refresh()
        except RedisError as exc:
            self._degrade(exc)
            raise
        if self.degraded:
            log.warning("state store: Redis is back, shared state again")
            self.degraded = False

    async def _refresh(self) -> None:
        """One pipeline; each script in it touches one pool's or one route's keys."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._canary_key)
            pipe.hgetall(self._probe_key)
            for pool in self._pools:
                line = self._line_keys(pool)
                pipe.eval(COUNT, 3, line[0], line[1], line[4])
            for route in self._routes:
                pipe.eval(CIRCUITS, 1, self.breaker_key(route))
            answers = await pipe.execute(raise_on_error=False)
        first_error = next((a for a in answers if isinstance(a, RedisError)), None)
        pools = self._pool_answers(answers[2 : 2 + len(self._pools)])
        if any(isinstance(a, RedisError) for a in answers[:2] + answers[2 + len(self._pools) :]):
            assert first_error is not None
            raise first_error
        canary, probes, *rest = answers
        now = time.monotonic()
        routes = rest[len(self._pools) :]
        in_flight = {pool: int(n[0]) for pool, n in pools.items()}
        waiting = {pool: int(n[1]) for pool, n in pools.items()}
        pending = {pool: int(n[2]) for pool, n in pools.items()}
        circuits: dict[str, float] = {}
        for route, (left_ms,) in zip(self._routes, routes, strict=True):
            if left_ms is not None:
                circuits[route] = now + int(left_ms) / 1000
        self._snapshot = replace(
            self._snapshot,
            in_flight=in_flight,
            waiting=waiting,
            pending_prompt_tokens=pending,
            canary_percent={k.decode(): float(v) for k, v in canary.items()},
            circuit_open=circuits,
            probe_order={k.decode(): probe_order(v) for k, v in probes.items()},
        )

    def _pool_answers(self, answers: Sequence[Any]) -> dict[str, Any]:
        """Each pool's counts; a pool whose keys Redis refused is broken (local slots), and
        one that answers again is mended."""
        found = {}
        for pool, answer in zip(self._pools, answers, strict=True):
            if isinstance(answer, ResponseError):
                self._break(pool, answer)
            elif isinstance(answer, RedisError):
                raise answer
            else:
                if pool in self._broken:
                    log.warning("state store: the keys of pool %s answer again: shared slots", pool)
                    self._broken.discard(pool)
                found[pool] = answer
        return found

    async def refresh_latency(self) -> None:
        """Recompute every route's windowed figures from the merged slices in Redis."""
        ttft = await self.latency_window(self._routes, Metric.TTFT, self._window_s)
        e2e = await self.latency_window(self._routes, Metric.E2E, self._window_s)
        self._snapshot = replace(
            self._snapshot, ttft=figures_by_route(ttft.items()), e2e=figures_by_route(e2e.items())
        )

    async def latency_window(
        self, routes: Sequence[str], metric: Metric, window_s: float
    ) -> dict[str, Histogram]:
        windows: dict[str, Histogram] = {}
        slices_by_route = await self._window_slices(
            routes, window_s, lambda route, start, step: self.latency_key(route, metric, start, step)
        )
        for route, slices in slices_by_route.items():
            merged = Histogram()
            for fields in slices:
                merged.merge(Histogram.from_fields(fields))
            windows[route] = merged
        return windows

    async def _window_slices(
        self, routes: Sequence[str], window_s: float, key: Callable[[str, int, int], str]
    ) -> dict[str, list[dict[bytes, bytes]]]:
        """Each route's slice hashes over the last `window_s` seconds (one round trip), at
        the resolution that keeps them at most a few hundred per route."""
        step = resolution_for(window_s)
        starts = slices_in_window(time.time(), window_s, step)
        async with self._redis.pipeline(transaction=False) as pipe:
            for route in routes:
                for start in starts:
                    pipe.hgetall(key(route, start, step))
            replies = await self._read(pipe)
        per_route = len(starts)
        return {route: replies[i * per_route : (i + 1) * per_route] for i, route in enumerate(routes)}

    @staticmethod
    async def _read(pipe: Any) -> list[Any]:
        """Run a pipeline of reads; Redis being away is StoreUnavailable for the caller."""
        try:
            return list(await pipe.execute())
        except RedisError as exc:
            raise StoreUnavailable(f"Redis is unreachable ({exc})") from exc

    async def flush(self) -> None:
        """Merge the buffered samples into Redis (one round trip); on failure they are lost,
        counted in the warning, rather than piling up while Redis is away."""
        slices = self._book.drain()
        counted = self._counts.drain()
        if not slices and not counted:
            return
        try:
            await self._merge(slices, counted)
        except RedisError:
            lost = sum(h.samples for h in slices.values())
            log.warning("state store: %d latency samples dropped, Redis unreachable", lost)
            raise

    async def _merge(
        self, slices: Mapping[tuple[str, Metric, int], Histogram], counted: Mapping[tuple[str, int], Counts]
    ) -> None:
        """Send the flush down the request path's line, lazily (with the next acquire). Each
        MERGE is a script call of its own, so one a restarted Redis did not know is loaded and
        sent again alone, the others not (they were applied)."""
        if isinstance(self._redis, RedisCluster):
            answers = await self._batch.call_all(self._merge_commands(slices, counted), lazy=True)
            errors = [answer for answer in answers if isinstance(answer, BaseException)]
            if errors:
                raise errors[0] if isinstance(errors[0], RedisError) else RedisError(str(errors[0]))
            return
        await asyncio.gather(
            *(
                self._batch.call_script(self._merge_sha, MERGE, keys, args, lazy=True)
                for keys, args in self._merge_scripts(slices, counted)
            )
        )

    def _rollup_ttl(self, step: int) -> int:
        return self._retention_s if step > SLICE_S else min(self._retention_s, _FINE_TTL_S)

    def _merge_scripts(
        self, slices: Mapping[tuple[str, Metric, int], Histogram], counted: Mapping[tuple[str, int], Counts]
    ) -> list[tuple[list[str], list[Any]]]:
        """The keys and arguments of one MERGE per 10 s slice, into the slice and its rollups."""
        ttls = [self._rollup_ttl(step) for step in ROLLUPS_S]
        calls: list[tuple[list[str], list[Any]]] = []
        for (route, metric, start), histogram in slices.items():
            keys = [self.latency_key(route, metric, slice_of(start, step), step) for step in ROLLUPS_S]
            args: list[Any] = [*ttls, len(histogram.counts)]
            for bucket, count in histogram.counts.items():
                args += [bucket, count]
            args += [
                Histogram.SUM_FIELD,
                repr(histogram.total),
                Histogram.SQUARES_FIELD,
                repr(histogram.total_sq),
            ]
            calls.append((keys, args))
        for (route, start), counts in counted.items():
            keys = [self.counts_key(route, slice_of(start, step), step) for step in ROLLUPS_S]
            args = [*ttls, 0]
            for name, value in counts.items():
                args += [name, repr(float(value))]
            calls.append((keys, args))
        return calls

    def _merge_commands(
        self, slices: Mapping[tuple[str, Metric, int], Histogram], counted: Mapping[tuple[str, int], Counts]
    ) -> list[tuple[Any, ...]]:
        """The same increments as plain commands, each routed to its own node (cluster)."""
        commands: list[tuple[Any, ...]] = []
        for step in ROLLUPS_S:
            ttl = self._rollup_ttl(step)
            for (route, metric, start), histogram in rolled_up(slices, step).items():
                key = self.latency_key(route, metric, start, step)
                for bucket, count in histogram.counts.items():
                    commands.append(("HINCRBY", key, bucket, count))
                commands.append(("HINCRBYFLOAT", key, Histogram.SUM_FIELD, repr(histogram.total)))
                commands.append(("HINCRBYFLOAT", key, Histogram.SQUARES_FIELD, repr(histogram.total_sq)))
                commands.append(("EXPIRE", key, ttl))
            for (route, start), counts in rolled_up_counts(counted, step).items():
                key = self.counts_key(route, start, step)
                for name, value in counts.items():
                    commands.append(("HINCRBYFLOAT", key, name, repr(float(value))))
                commands.append(("EXPIRE", key, ttl))
        return commands

    async def _release_all(self) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for pool, tokens in self._held.items():
                if tokens:
                    pipe.zrem(self.key(pool), *tokens)
                    for token in tokens:
                        pipe.eval(FORGET_PENDING, 2, *self._pending_keys(pool), token)
            await pipe.execute()
        self._held.clear()

    async def renew(self) -> None:
        """Push the expiry of every lease this process holds (one round trip)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for pool, tokens in self._held.items():
                if tokens:
                    pipe.eval(RENEW, 3, self.key(pool), *self._pending_keys(pool), self._ttl_ms, *tokens)
            await pipe.execute()

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except RedisError:
            return False

    async def close(self) -> None:
        """Flush what is buffered, give back every lease still held (requests cancelled at
        the end of a drain), then stop the background work (bounded: a task stuck in I/O is
        abandoned after 2 s)."""
        self._stopping.set()
        with contextlib.suppress(RedisError, TimeoutError):
            await asyncio.wait_for(self.flush(), 1.0)
        with contextlib.suppress(RedisError, TimeoutError):
            await asyncio.wait_for(self._release_all(), 1.0)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks.clear()
        await self._batch.close()
        await self._redis.aclose()

    async def start(self) -> None:
        """Check Redis, then start refresh, renewal and flushing; call once, inside the event
        loop. Unreachable (or refusing our password) at start is StoreUnreachableAtStart,
        unless `start_degraded` was set: then the store starts deciding locally, loudly."""
        if self._tasks:
            return
        try:
            await self._refresh()  # not refresh(): its "deciding locally" would contradict a refusal
            await self._batch.call("PING")  # and the request path's own connection
        except RedisError as exc:
            if not self._start_degraded:
                raise StoreUnreachableAtStart(
                    f"state.redis_url: cannot use Redis at {self._url} ({type(exc).__name__}: {exc}); "
                    "fix it, or set state.start_degraded: true to start with per-process slots"
                ) from None  # the message carries the cause; its traceback would only bury it
            self.degraded = True
            log.error(
                "state store: Redis at %s unreachable at start; state.start_degraded is set, so this "
                "process decides locally (fallback_share of each pool) until Redis answers: %s",
                self._url,
                exc,
            )
        loop = asyncio.get_running_loop()
        survives = (RedisError, StoreUnavailable)  # Redis away: log, keep trying
        self._tasks = [
            loop.create_task(every(interval, step, self._stopping, survives=survives))
            for interval, step in (
                (self._refresh_s, self.refresh),
                (self._ttl_ms / 3000, self.renew),
                (self._flush_s, self.flush),
                (1.0, self.refresh_latency),
            )
        ]


def _only(counts: Mapping[str, int], pools: set[str]) -> dict[str, int]:
    return {pool: counts.get(pool, 0) for pool in pools}


def _task_state(reply: Sequence[Any]) -> TaskState:
    route, ok, failed, owner = reply
    return TaskState(_text(route), bool(int(ok)), bool(int(failed)), _text(owner))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
