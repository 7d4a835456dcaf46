"""Retry budget: retries may be at most `budget_percent` of a model's requests over a sliding
window (per process), so a failing upstream cannot multiply the load with retry storms.

`min_retries` per window are always allowed, so a quiet model can still retry its rare
failures. Counts live in one-second buckets; nothing here does I/O.
"""

from __future__ import annotations

import math
import time

from router.config import RetryConfig


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


class RetryBudget:
    def __init__(self, config: RetryConfig) -> None:
        self._config = config
        self._requests = Window(config.budget_window_s)
        self._retries = Window(config.budget_window_s)

    def request(self, now: float | None = None) -> None:
        self._requests.add(time.monotonic() if now is None else now)

    def try_retry(self, now: float | None = None) -> bool:
        """Spend one retry if the budget allows it; False means do not retry."""
        now = time.monotonic() if now is None else now
        allowed = max(self._config.min_retries, self._config.budget_percent / 100 * self._requests.total(now))
        if self._retries.total(now) + 1 > allowed:
            return False
        self._retries.add(now)
        return True
