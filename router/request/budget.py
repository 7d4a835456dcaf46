"""A share budget: extra attempts may be at most a percent of a model's requests over a sliding
window (per process), and always a minimum per window.

Two budgets use it. Retries (`retry.budget_percent`, `min_retries`): a failing upstream cannot
multiply the load with retry storms, and a quiet model can still retry its rare failures.
Hedges (`hedge.max_percent`, `min_hedges`, router/request/hedge.py): a dedicated endpoint that stalls
every request cannot double the spend. Counts live in one-second buckets; nothing here does
I/O.
"""

from __future__ import annotations

import math
import time

from router.config import HedgeConfig, RetryConfig


class Window:
    """Event counts per whole second over the last `seconds` (a ring of buckets)."""

    def __init__(self, seconds: float) -> None:
        self._size = max(1, math.ceil(seconds))
        self._counts = [0] * self._size
        self._stamps = [-1] * self._size

    def add(self, now: float) -> None:
        second = int(now)
        i = second % self._size
        if self._stamps[i] != second:
            self._stamps[i], self._counts[i] = second, 0
        self._counts[i] += 1

    def total(self, now: float) -> int:
        oldest = int(now) - self._size + 1
        return sum(c for c, s in zip(self._counts, self._stamps, strict=True) if s >= oldest)


class ShareBudget:
    """At most `percent` of the requests counted within `window_s` may spend from it, or
    `minimum` when that is more."""

    def __init__(self, percent: float, window_s: float, minimum: int) -> None:
        self._share = percent / 100
        self._minimum = minimum
        self._requests = Window(window_s)
        self._spent = Window(window_s)

    def request(self, now: float | None = None) -> None:
        self._requests.add(time.monotonic() if now is None else now)

    def try_spend(self, now: float | None = None) -> bool:
        """Spend one if the budget allows it; False means do not (retry, hedge)."""
        now = time.monotonic() if now is None else now
        allowed = max(self._minimum, self._share * self._requests.total(now))
        if self._spent.total(now) + 1 > allowed:
            return False
        self._spent.add(now)
        return True


def retry_budget(config: RetryConfig) -> ShareBudget:
    return ShareBudget(config.budget_percent, config.budget_window_s, config.min_retries)


def hedge_budget(config: HedgeConfig) -> ShareBudget:
    return ShareBudget(config.max_percent, config.window_s, config.min_hedges)
