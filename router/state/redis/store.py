"""The shared store, for many workers and replicas: one role object each (router/state/roles.py)
over one link (router/state/redis/link.py): leases (dedicated slots and the line for them),
series (latency histograms and counters), circuits, leadership, canary runs, rankings, spend
(control.py), tasks, quotas and members (DNS pools' slot sets). Consumers take the role they
use (`store.leases`, ...).
Every command goes down one of two Batchers (router/state/redis/batch.py): the request path's
(acquires, releases, settlements, quota steps) and the background's (everything else), so no
window read queues ahead of an acquire. On a single Redis each is a connection of the store's
own (line.py); on Redis Cluster, or with `state.redis_client: redis-py`, both use the one
redis-py client (router/state/redis/clients.py).

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

from redis.exceptions import RedisError

from policies.types import Snapshot
from router.errors import StoreUnavailable
from router.periodic import Loops
from router.state.redis.address import BadRedisUrl, redacted
from router.state.redis.batch import TIMEOUT_S, Batcher
from router.state.redis.clients import ClientName, keyed, target_of
from router.state.redis.control import (
    RedisCanaryRuns,
    RedisCircuits,
    RedisLeadership,
    RedisRankings,
    RedisSpend,
)
from router.state.redis.keys import Keys
from router.state.redis.leases import RedisLeases
from router.state.redis.link import LinkSettings, RedisLink, SnapshotFeed, ask, log
from router.state.redis.members import RedisMembers
from router.state.redis.quotas import RedisQuotas
from router.state.redis.series import RedisSeries
from router.state.redis.tasks import RedisTasks
from router.state.roles import StoreUnreachableAtStart


class RedisStore:
    """The roles over one link; `feeds` are the roles the refresh reads for the snapshot."""

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
        client: ClientName = "line",
        password_file: str = "",
        start_degraded: bool = False,
        loops: Loops | None = None,
    ) -> None:
        self.loops = loops or Loops()
        self._url = redacted(url)
        try:
            target = target_of(
                url, cluster=cluster, timeout_s=timeout_s, client=client, password_file=password_file
            )
        except BadRedisUrl as exc:
            raise StoreUnreachableAtStart(keyed(exc)) from None
        settings = LinkSettings(
            pools=tuple(sorted(set(pools))),
            routes=tuple(sorted(set(routes))),
            ttl_ms=int(lease_ttl_s * 1000),
            window_s=window_s,
            retention_s=int(retention_s),
            fallback_share=fallback_share,
        )
        request_batch = Batcher(target, timeout_s, closes_client=False)  # a redis-py client is shared
        self._link = link = RedisLink(
            Batcher(target, timeout_s),
            request_batch,
            Keys(prefix),
            settings,
        )
        self.leases = RedisLeases(link)
        self.series = RedisSeries(link)
        self.circuits = RedisCircuits(link)
        self.leadership = RedisLeadership(link)
        self.canary = RedisCanaryRuns(link)
        self.rankings = RedisRankings(link)
        self.spend = RedisSpend(link)
        self.tasks = RedisTasks(link)
        self.quotas = RedisQuotas(link)
        self.members = RedisMembers(link)
        self._feeds: tuple[SnapshotFeed, ...] = (self.leases, self.circuits, self.canary, self.rankings)
        self._start_degraded = start_degraded
        self.started_at = time.time()  # this process; the first replica's once start() read it
        self._refresh_s, self._flush_s = refresh_s, flush_s
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def degraded(self) -> bool:
        return self._link.degraded

    @property
    def fallback_admissions(self) -> int:
        return self.leases.fallback_admissions

    def snapshot(self) -> Snapshot:
        broken = self.leases.broken
        if not self._link.degraded and not broken:
            return replace(self._link.snapshot, now=time.monotonic())
        in_flight, waiting, pending = self.leases.local_counts()
        shared, now = self._link.snapshot, time.monotonic()
        if self._link.degraded:  # every pool's slots are local now
            return replace(
                shared, now=now, in_flight=in_flight, waiting=waiting, pending_prompt_tokens=pending
            )
        return replace(  # those pools' slots are local: so are their counts
            shared,
            now=now,
            in_flight={**shared.in_flight, **_only(in_flight, broken)},
            waiting={**shared.waiting, **_only(waiting, broken)},
            pending_prompt_tokens={**shared.pending_prompt_tokens, **_only(pending, broken)},
        )

    async def refresh(self) -> None:
        """Read every feed's share of the snapshot (pool counts, canary percents, rankings,
        parity verdicts, open circuits) in one round trip. The snapshot is replaced, never
        mutated, so readers need no copy. Failing marks the store degraded; succeeding ends that."""
        try:
            await self._refresh()
        except RedisError as exc:
            self._link.degrade(exc)
            raise
        if self._link.degraded:
            log.warning("state store: Redis is back, shared state again")
            self._link.degraded = False

    async def _refresh(self) -> None:
        asked = [feed.refresh_commands() for feed in self._feeds]
        answers = await self._link.batch.call_all([command for commands in asked for command in commands])
        fields: dict[str, Any] = {}
        at = 0
        for feed, commands in zip(self._feeds, asked, strict=True):
            fields.update(feed.read_refresh(answers[at : at + len(commands)]))
            at += len(commands)
        self._link.publish(**fields)

    async def ping(self) -> bool:
        try:
            return bool(await self._link.batch.call("PING"))
        except RedisError:
            return False

    async def _first_start(self) -> None:
        """`started_at`: when the first replica sharing this Redis started (kept there), so a
        report bills dedicated capacity only from when the gateway existed, not a whole window."""
        batch, key = self._link.batch, self._link.keys.started_at
        await ask(batch, "the start time could not be stored", "SET", key, repr(self.started_at), "NX")
        found = await ask(batch, "the start time could not be read", "GET", key)
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
            self._link.degraded = True
            log.error(
                "state store: Redis at %s unreachable at start; state.start_degraded is set, so this "
                "process decides locally (fallback_share of each pool) until Redis answers: %s",
                self._url,
                exc,
            )
        if not self._link.degraded:
            await self._first_start()
        survives = (RedisError, StoreUnavailable)  # Redis away: log, keep trying
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.loops.every(name, interval, step, self._link.stopping, survives=survives))
            for name, interval, step in (
                ("store refresh", self._refresh_s, self.refresh),
                ("lease renewal", self._link.settings.ttl_ms / 3000, self.leases.renew),
                ("sample flush", self._flush_s, self.series.flush),
                ("latency refresh", 1.0, self.series.refresh_latency),
            )
        ]

    async def close(self) -> None:
        """Flush what is buffered, give back every lease still held (requests cancelled at
        the end of a drain), then stop the background work (bounded: a task stuck in I/O is
        abandoned after 2 s)."""
        self._link.stopping.set()
        with contextlib.suppress(RedisError, TimeoutError):
            await asyncio.wait_for(self.series.flush(), 1.0)
        with contextlib.suppress(RedisError, TimeoutError):
            await asyncio.wait_for(self.leases.release_all(), 1.0)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks.clear()
        await self._link.request_batch.close()
        await self._link.batch.close()


def _only(counts: Mapping[str, int], pools: set[str]) -> dict[str, int]:
    return {pool: counts.get(pool, 0) for pool in pools}
