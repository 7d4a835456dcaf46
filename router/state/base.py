"""The state-store seam: admission slots on dedicated pools and the snapshot policies read.

Contract, for every implementation:
- `try_acquire(pool, capacity)` is atomic: no interleaving of calls, from any number of
  tasks, processes or replicas sharing the store, holds more than `capacity` leases on
  `pool` at once. It returns None when the pool is full; it never waits.
- `release(lease)` is idempotent and never raises for a lease that is already gone.
- `snapshot()` is cheap enough for every request (no I/O on the request path); its
  figures may lag the truth by the store's refresh interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Lease:
    """One admitted request's slot on a dedicated pool."""

    pool: str
    token: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the store knows now. `now` is a monotonic time in seconds; `in_flight` maps a
    dedicated pool name to the leases held on it across every process sharing the store;
    `canary_percent` holds the live canary overrides set through the admin API."""

    now: float
    in_flight: Mapping[str, int] = field(default_factory=dict)
    canary_percent: Mapping[str, float] = field(default_factory=dict)  # model -> live override


class StateStore(Protocol):
    name: str

    async def try_acquire(self, pool: str, capacity: int) -> Lease | None: ...

    async def release(self, lease: Lease) -> None: ...

    def snapshot(self) -> Snapshot: ...

    async def set_canary(self, model: str, percent: float) -> None:
        """Set a model's live canary percent for every process sharing the store."""

    async def start(self) -> None:
        """Begin background work (refresh, renewal); called once by the app's lifespan."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
