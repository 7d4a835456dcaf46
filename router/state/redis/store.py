"""The shared store, for many workers and replicas: its roles composed (router/state/roles.py),
each a module of this folder: leases (dedicated slots and the line for them), series (latency
histograms and counters), control (circuits, leader leases, canary runs, rankings, spend),
tasks. Every command goes down one Batcher (router/state/redis/batch.py): on a single Redis,
one connection of the store's own (line.py); on Redis Cluster, redis-py's cluster client.

On the request path Redis costs exactly one round trip: the acquire (the release and the
task settlement linger up to 2 ms for the next request's acquire and travel with it).
`snapshot()` reads copies that background tasks refresh: pool counts, canary percents,
rankings and open circuits every `refresh_s` (one round trip), latency figures every second.

Redis errors never reach a request. When Redis cannot be reached the store is *degraded*:
admission falls back to per-process slots (router/state/redis/leases.py), the snapshot shows
those local counts, samples that cannot be flushed are dropped with a warning, and the
background refresh keeps trying; its first success ends the degraded state by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from redis.asyncio import RedisCluster
from redis.exceptions import RedisError

from policies.types import Snapshot
from router.errors import StoreUnavailable
from router.periodic import Loops
from router.state.latency import CountBook, LatencyBook
from router.state.memory.leases import MemoryLeases
from router.state.rankings import diverging, probe_order
from router.state.redis.address import BadRedisUrl, RedisAddress, read_url, redacted
from router.state.redis.batch import TIMEOUT_S, Batcher
from router.state.redis.control import RedisControl
from router.state.redis.keys import Keys
from router.state.redis.leases import RedisLeases
from router.state.redis.parts import log
from router.state.redis.quotas import RedisQuotas
from router.state.redis.readings import Readings
from router.state.redis.series import RedisSeries
from router.state.redis.tasks import RedisTasks
from router.state.roles import StoreUnreachableAtStart

_CLUSTER_CONNECTIONS = 32  # per node: more callers wait for one


def target_of(url: str, *, cluster: bool, timeout_s: float = TIMEOUT_S) -> RedisCluster | RedisAddress:
    """What the Batcher talks to: a cluster client (redis-py) for `cluster` or a
    `redis+cluster://` URL, else the single Redis's address (its own line). Both read the URL
    with one parser, so an option means the same on either path (router/state/redis/address.py)."""
    plain, address, names_cluster = read_url(url)
    if cluster or names_cluster:
        return RedisCluster.from_url(
            plain,
            max_connections=_CLUSTER_CONNECTIONS,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
    return address


class RedisStore(RedisLeases, RedisSeries, RedisControl, RedisTasks, RedisQuotas):
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
        timeout_s: float = TIMEOUT_S,
        start_degraded: bool = False,
        loops: Loops | None = None,
    ) -> None:
        self.loops = loops or Loops()
        self._url = redacted(url)
        try:
            target = target_of(url, cluster=cluster, timeout_s=timeout_s)
        except BadRedisUrl as exc:
            raise StoreUnreachableAtStart(f"state.redis_url: {exc}") from None
        self._cluster = isinstance(target, RedisCluster)
        self._batch = Batcher(target, timeout_s)
        self._keys = Keys(prefix)
        self._start_degraded = start_degraded
        self.started_at = time.time()  # this process; the first replica's once start() read it
        self._pools = sorted(set(pools))
        self._routes = sorted(set(routes))
        self._ttl_ms = int(lease_ttl_s * 1000)
        self._refresh_s, self._flush_s = refresh_s, flush_s
        self._window_s = window_s
        self._retention_s = int(retention_s)
        self._fallback_share = fallback_share
        self._local = MemoryLeases()
        self.degraded = False
        self.fallback_admissions = 0
        self._held, self._broken, self._released = {}, set(), {}
        self._book, self._counts = LatencyBook(), CountBook()
        self._readings = Readings()
        self._snapshot = Snapshot(now=0.0)
        self._tasks: list[asyncio.Task[None]] = []
        self._cleanups = set()
        self._stopping = asyncio.Event()

    def snapshot(self) -> Snapshot:
        if not self.degraded and not self._broken:
            return replace(self._snapshot, now=time.monotonic())
        in_flight, waiting, pending = self.local_counts()
        shared, now = self._snapshot, time.monotonic()
        if self.degraded:  # every pool's slots are local now
            return replace(
                shared, now=now, in_flight=in_flight, waiting=waiting, pending_prompt_tokens=pending
            )
        return replace(  # those pools' slots are local: so are their counts
            shared,
            now=now,
            in_flight={**shared.in_flight, **_only(in_flight, self._broken)},
            waiting={**shared.waiting, **_only(waiting, self._broken)},
            pending_prompt_tokens={**shared.pending_prompt_tokens, **_only(pending, self._broken)},
        )

    async def refresh(self) -> None:
        """Read every pool's live lease and waiter counts, the canary overrides, the rankings
        and the open circuits (sent at once). The snapshot is replaced, never mutated, so
        readers need no copy. Failing marks the store degraded; succeeding ends that."""
        try:
            await self._refresh()
        except RedisError as exc:
            self._degrade(exc)
            raise
        if self.degraded:
            log.warning("state store: Redis is back, shared state again")
            self.degraded = False

    async def _refresh(self) -> None:
        keys, shared, read = self._keys, self._snapshot, self._readings
        head = [("HGETALL", keys.canary_percent), ("HGETALL", keys.rankings), ("HGETALL", keys.parity)]
        answers = await self._batch.call_all([*head, *self.count_commands(), *self.circuit_commands()])
        pools_end = len(head) + len(self._pools)
        pools = self.pool_counts(answers[len(head) : pools_end])  # a pool's own error breaks that pool only
        canary = read.mapping("canary percents", answers[0], float, shared.canary_percent)
        rankings = read.mapping("probe rankings", answers[1], probe_order, shared.probe_order)
        parity = read.mapping("parity verdicts", answers[2], diverging, shared.parity_diverges)
        now = time.monotonic()
        circuits = {}
        for route, answer in zip(self._routes, answers[pools_end:], strict=True):
            left_ms = read.value(f"the circuit of {route}", answer, _left_ms)
            if left_ms is not None:
                circuits[route] = now + left_ms / 1000
        counts = {
            pool: n for pool, answer in pools.items() if (n := read.value(f"pool {pool}", answer, _counts))
        }
        self._snapshot = replace(
            shared,
            in_flight={pool: n[0] for pool, n in counts.items()},
            waiting={pool: n[1] for pool, n in counts.items()},
            pending_prompt_tokens={pool: n[2] for pool, n in counts.items()},
            canary_percent=canary,
            circuit_open=circuits,
            probe_order=rankings,
            parity_diverges=parity,
        )

    async def ping(self) -> bool:
        try:
            return bool(await self._batch.call("PING"))
        except RedisError:
            return False

    async def _first_start(self) -> None:
        """`started_at`: when the first replica sharing this Redis started (kept there), so a
        report bills dedicated capacity only from when the gateway existed, not a whole window."""
        await self._ask(
            "the start time could not be stored", "SET", self._keys.started_at, repr(self.started_at), "NX"
        )
        found = await self._ask("the start time could not be read", "GET", self._keys.started_at)
        self.started_at = min(self.started_at, float(found)) if found else self.started_at

    async def start(self) -> None:
        """Check Redis, then start refresh, renewal and flushing; call once, inside the event
        loop. Unreachable (or refusing our password) at start is StoreUnreachableAtStart,
        unless `start_degraded` was set: then the store starts deciding locally, loudly."""
        if self._tasks:
            return
        try:
            await self._refresh()  # not refresh(): its "deciding locally" would contradict a refusal
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
        if not self.degraded:
            await self._first_start()
        survives = (RedisError, StoreUnavailable)  # Redis away: log, keep trying
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.loops.every(name, interval, step, self._stopping, survives=survives))
            for name, interval, step in (
                ("store refresh", self._refresh_s, self.refresh),
                ("lease renewal", self._ttl_ms / 3000, self.renew),
                ("sample flush", self._flush_s, self.flush),
                ("latency refresh", 1.0, self.refresh_latency),
            )
        ]

    async def close(self) -> None:
        """Flush what is buffered, give back every lease still held (requests cancelled at
        the end of a drain), then stop the background work (bounded: a task stuck in I/O is
        abandoned after 2 s)."""
        self._stopping.set()
        with contextlib.suppress(RedisError, TimeoutError):
            await asyncio.wait_for(self.flush(), 1.0)
        with contextlib.suppress(RedisError, TimeoutError):
            await asyncio.wait_for(self.release_all(), 1.0)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks.clear()
        await self._batch.close()


def _only(counts: Mapping[str, int], pools: set[str]) -> dict[str, int]:
    return {pool: counts.get(pool, 0) for pool in pools}


def _left_ms(answer: Any) -> int | None:
    """A circuit's reply: the milliseconds its cooldown has left (None: closed)."""
    (left,) = answer
    return None if left is None else int(left)


def _counts(answer: Any) -> tuple[int, int, int]:
    return int(answer[0]), int(answer[1]), int(answer[2])
