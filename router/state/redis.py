"""The shared store: dedicated slots as expiring leases in Redis, for many workers/replicas.

Each dedicated pool is a sorted set `tidegate:slots:{pool}` of lease tokens scored by their
expiry (Redis server time, ms). Acquire is one Lua script: drop expired leases, then add one
if fewer than `capacity` remain. A replica renews the leases it holds every `ttl / 3`, so a
replica killed with SIGKILL leaks its slots for at most `lease_ttl_s`.

On the request path Redis costs exactly two round trips: the acquire and the release.
`snapshot()` reads a copy of the pool counts that a background task refreshes every
`refresh_s`. Redis errors never reach the request: an acquire that cannot reach Redis admits
nothing (the request spills), a release that cannot reach Redis is left to the lease TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from router.state.base import Lease, Snapshot

log = logging.getLogger("tidegate.state")

_NOW_MS = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""

_ACQUIRE = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return 1
"""
)

_RENEW = (
    _NOW_MS
    + """
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now_ms + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
return 1
"""
)

_COUNT = (
    _NOW_MS
    + """
local counts = {}
for i = 1, #KEYS do
  counts[i] = redis.call('ZCOUNT', KEYS[i], '(' .. now_ms, '+inf')
end
return counts
"""
)


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        pools: Iterable[str],
        *,
        lease_ttl_s: float = 30.0,
        refresh_s: float = 0.2,
        prefix: str = "tidegate",
    ) -> None:
        self._redis: Redis = Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._pools = sorted(set(pools))
        self._ttl_ms = int(lease_ttl_s * 1000)
        self._refresh_s = refresh_s
        self._prefix = prefix
        self._canary_key = f"{prefix}:canary"
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew = self._redis.register_script(_RENEW)
        self._count = self._redis.register_script(_COUNT)
        self._held: dict[str, set[str]] = {}
        self._in_flight: dict[str, int] = {}
        self._canary: dict[str, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    def key(self, pool: str) -> str:
        return f"{self._prefix}:slots:{{{pool}}}"

    async def try_acquire(self, pool: str, capacity: int) -> Lease | None:
        token = uuid.uuid4().hex
        try:
            admitted = await self._acquire(keys=[self.key(pool)], args=[capacity, token, self._ttl_ms])
        except RedisError as exc:
            log.warning("state store: acquire on %s failed, spilling: %s", pool, exc)
            return None
        if not admitted:
            return None
        self._held.setdefault(pool, set()).add(token)
        return Lease(pool, token)

    async def release(self, lease: Lease) -> None:
        self._held.get(lease.pool, set()).discard(lease.token)
        try:
            await self._redis.zrem(self.key(lease.pool), lease.token)
        except RedisError as exc:
            log.warning("state store: release on %s failed, the lease will expire: %s", lease.pool, exc)

    def snapshot(self) -> Snapshot:
        return Snapshot(now=time.monotonic(), in_flight=self._in_flight, canary_percent=self._canary)

    async def set_canary(self, model: str, percent: float) -> None:
        await self._redis.hset(self._canary_key, model, str(percent))
        self._canary = {**self._canary, model: percent}

    async def refresh(self) -> None:
        """Read every pool's live lease count and the canary overrides (one round trip).
        The snapshot's mappings are replaced, never mutated, so readers need no copy."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._canary_key)
            if self._pools:
                await self._count(keys=[self.key(p) for p in self._pools], client=pipe)
            canary, *counts = await pipe.execute()
        if self._pools:
            self._in_flight = dict(zip(self._pools, map(int, counts[0]), strict=True))
        self._canary = {k.decode(): float(v) for k, v in canary.items()}

    async def renew(self) -> None:
        """Push the expiry of every lease this process holds (one round trip)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for pool, tokens in self._held.items():
                if tokens:
                    await self._renew(keys=[self.key(pool)], args=[self._ttl_ms, *tokens], client=pipe)
            await pipe.execute()

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except RedisError:
            return False

    async def close(self) -> None:
        """Stop the background work (bounded: a task stuck in I/O is abandoned after 2 s)."""
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks.clear()
        await self._redis.aclose()

    async def start(self) -> None:
        """Start the snapshot refresh and lease renewal; call once, inside the event loop."""
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._every(self._refresh_s, self.refresh)),
            loop.create_task(self._every(self._ttl_ms / 3000, self.renew)),
        ]

    async def _every(self, interval: float, job: Callable[[], Awaitable[None]]) -> None:
        """Run `job` every `interval` s until close(); the stop flag is checked on every
        turn because a client library may turn a cancellation into its own error."""
        while not self._stopping.is_set():
            try:
                await job()
            except RedisError as exc:
                log.warning("state store: background %s failed: %s", job.__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
