"""Circuit breakers: count each route's attempt results in this process, and open the
route's circuit in the shared store when they say it is broken.

Counting is local (no round trip per request); the open state is shared, so one replica's
evidence makes every replica skip the route (`policies/health.py` reads it from the
snapshot). States, per route:
- closed: attempts flow; `consecutive_failures` in a row, or an error rate of at least
  `error_rate_percent` over `min_requests` or more attempts in `window_s`, trips it;
- open: skipped until the cooldown ends; a failure seen meanwhile (a straggler, a panic-mode
  attempt) trips it again, which extends the cooldown, never shortens it;
- half-open (cooldown over, still in the store): attempts are trials; a success closes the
  circuit, a failure trips it again with a doubled cooldown (up to `max_cooldown_s`).
Store errors are logged; the local counts keep going.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.types import Snapshot, route_key
from router.config import BreakerConfig, GatewayConfig
from router.errors import StoreUnavailable

log = logging.getLogger("tidegate.breaker")


class Circuits(Protocol):
    """The state store as the breakers use it: circuits shared by every replica; both raise
    StoreUnavailable when the store cannot be reached."""

    async def trip(self, route: str, cooldown_s: float, max_cooldown_s: float) -> float: ...

    async def reset_circuit(self, route: str) -> None: ...


@dataclass(slots=True)
class RouteCounts:
    """Attempt results of one route in this process."""

    consecutive_failures: int = 0
    window: deque[tuple[float, bool]] = field(default_factory=deque)  # (monotonic time, ok)
    failures_in_window: int = 0

    def add(self, ok: bool, now: float, window_s: float) -> None:
        self.consecutive_failures = 0 if ok else self.consecutive_failures + 1
        self.window.append((now, ok))
        self.failures_in_window += not ok
        while self.window and self.window[0][0] < now - window_s:
            _, was_ok = self.window.popleft()
            self.failures_in_window -= not was_ok

    def broken(self, config: BreakerConfig) -> bool:
        if self.consecutive_failures >= config.consecutive_failures:
            return True
        total = len(self.window)
        return (
            total >= config.min_requests
            and self.failures_in_window * 100 >= config.error_rate_percent * total
        )


class Breakers:
    def __init__(self, store: Circuits, configs: Mapping[str, BreakerConfig]) -> None:
        """`configs` maps each route key to its model's breaker config."""
        self._store = store
        self._configs = configs
        self._counts: dict[str, RouteCounts] = {}
        self._pending: set[asyncio.Task[None]] = set()

    def record(self, route: str, ok: bool, snapshot: Snapshot) -> None:
        """One attempt's result. Never waits: store writes run in the background."""
        config = self._configs.get(route)
        if config is None:
            return
        counts = self._counts.setdefault(route, RouteCounts())
        counts.add(ok, time.monotonic(), config.window_s)
        if ok:
            if snapshot.half_open(route):  # a trial after the cooldown: close
                counts.window.clear()
                counts.failures_in_window = 0
                self._background(self._reset(route))
            return
        if route in snapshot.circuit_open or counts.broken(config):
            counts.consecutive_failures = 0  # the next trip needs fresh evidence
            self._background(self._trip(route, config))

    async def _trip(self, route: str, config: BreakerConfig) -> None:
        try:
            left = await self._store.trip(route, config.cooldown_s, config.max_cooldown_s)
        except StoreUnavailable as exc:
            log.warning("circuit breaker: cannot open %s in the store: %s", route, exc)
            return
        log.warning("circuit breaker: %s open for %.1f s", route, left)

    async def _reset(self, route: str) -> None:
        try:
            await self._store.reset_circuit(route)
        except StoreUnavailable as exc:
            log.warning("circuit breaker: cannot close %s in the store: %s", route, exc)
            return
        log.warning("circuit breaker: %s closed (its trial succeeded)", route)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


def breaker_configs(config: GatewayConfig) -> dict[str, BreakerConfig]:
    """Each route's breaker config: its model's."""
    return {route_key(name, e.name): m.breaker for name, m in config.models.items() for e in m.endpoints}
