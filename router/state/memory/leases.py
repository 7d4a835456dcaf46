"""Dedicated slots in one process: plain counters, atomic because the event loop runs one task
at a time. Waiters queue FIFO per pool; a release hands the slot straight to the first in line.
Also the Redis store's fallback while Redis is away (router/state/redis/leases.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from router.state.slots import Lease, Slots

_Waiter = tuple[asyncio.Future[Lease], int, int, int]


class MemoryLeases:
    def __init__(self) -> None:
        self._held: defaultdict[str, dict[str, int]] = defaultdict(dict)  # pool -> token -> weight
        self._used: defaultdict[str, int] = defaultdict(int)  # pool -> slots held
        self._pending: defaultdict[str, dict[str, int]] = defaultdict(dict)  # pool -> token -> tokens
        self._pending_sum: defaultdict[str, int] = defaultdict(int)
        # pool -> waiters: (future, weight, prompt tokens, the capacity each asked for)
        self._queues: defaultdict[str, deque[_Waiter]] = defaultdict(deque)
        self._tokens = itertools.count()
        self._prefill_samples: dict[str, deque[tuple[float, float]]] = {}

    async def try_acquire(self, pool: str, slots: Slots, wait_s: float = 0.0) -> Lease | None:
        queue = self._queues[pool]
        if self._used[pool] + slots.weight <= slots.capacity and not queue:
            if not self._prefill_fits(pool, slots):
                return None
            return self._grant(pool, slots.weight, slots.prompt_tokens)
        if wait_s <= 0 or len(queue) >= slots.max_waiters:
            return None
        waiter: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        entry = (waiter, slots.weight, slots.prompt_tokens, slots.capacity)  # its own pool size
        queue.append(entry)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), wait_s)
        except TimeoutError:
            return waiter.result() if waiter.done() else None  # granted right at the deadline
        except asyncio.CancelledError:
            if waiter.done():
                self._release(waiter.result())
            raise
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(entry)
            waiter.cancel()

    def _prefill_fits(self, pool: str, slots: Slots) -> bool:
        pending = self._pending_sum[pool]
        limit = slots.max_pending_tokens
        return limit is None or pending == 0 or pending + slots.prompt_tokens <= limit

    def _grant(self, pool: str, weight: int, prompt_tokens: int = 0) -> Lease:
        token = str(next(self._tokens))
        self._held[pool][token] = weight
        self._used[pool] += weight
        if prompt_tokens > 0:
            self._pending[pool][token] = prompt_tokens
            self._pending_sum[pool] += prompt_tokens
        return Lease(pool, token, weight, prompt_tokens, self._pending_sum[pool])

    async def prefilled(self, lease: Lease) -> None:
        self._forget_pending(lease)

    async def prefill_samples(
        self, pool: str, new: Sequence[tuple[float, float]], keep: int
    ) -> list[tuple[float, float]]:
        window = self._prefill_samples.get(pool)
        if window is None or window.maxlen != keep:
            window = self._prefill_samples[pool] = deque(window or (), maxlen=keep)
        window.extend(new)
        return list(window)

    def _forget_pending(self, lease: Lease) -> None:
        tokens = self._pending[lease.pool].pop(lease.token, None)
        if tokens is not None:
            self._pending_sum[lease.pool] -= tokens

    async def release(self, lease: Lease) -> None:
        self._release(lease)

    def _release(self, lease: Lease) -> None:
        self._forget_pending(lease)
        weight = self._held[lease.pool].pop(lease.token, None)
        if weight is None:
            return
        self._used[lease.pool] -= weight
        queue = self._queues[lease.pool]
        # FIFO: the head first, within the capacity it asked for (a caller asking for a smaller
        # pool, a batch request or a shadow, never changes what a waiter may have)
        while queue and self._used[lease.pool] + queue[0][1] <= queue[0][3]:
            waiter, wanted, prompt_tokens, _ = queue.popleft()
            if not waiter.done():
                waiter.set_result(self._grant(lease.pool, wanted, prompt_tokens))

    def in_flight(self) -> dict[str, int]:
        return dict(self._used)

    def waiting(self) -> dict[str, int]:
        return {pool: len(queue) for pool, queue in self._queues.items()}

    def pending_prompt_tokens(self) -> dict[str, int]:
        return dict(self._pending_sum)

    def snapshot_fields(self) -> dict[str, Any]:
        return {
            "in_flight": dict(self._used),
            "waiting": {pool: len(queue) for pool, queue in self._queues.items()},
            "pending_prompt_tokens": dict(self._pending_sum),
        }

    def forget_leases(self) -> None:
        """At close: nothing is held any more."""
        self._held.clear()
        self._used.clear()
