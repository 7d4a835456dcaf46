"""The embedded store: one process, one event loop, no I/O. The default without Redis."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

from router.state.base import Lease, Snapshot


class MemoryStore:
    """Slots are plain counters; atomic because the event loop runs one task at a time."""

    name = "memory"

    def __init__(self) -> None:
        self._held: defaultdict[str, set[str]] = defaultdict(set)
        self._tokens = itertools.count()
        self._canary: dict[str, float] = {}

    async def try_acquire(self, pool: str, capacity: int) -> Lease | None:
        held = self._held[pool]
        if len(held) >= capacity:
            return None
        token = str(next(self._tokens))
        held.add(token)
        return Lease(pool, token)

    async def release(self, lease: Lease) -> None:
        self._held[lease.pool].discard(lease.token)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=time.monotonic(),
            in_flight={pool: len(held) for pool, held in self._held.items()},
            canary_percent=dict(self._canary),
        )

    async def set_canary(self, model: str, percent: float) -> None:
        self._canary[model] = percent

    async def start(self) -> None:
        return None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._held.clear()
