"""The statistics the offline tools share (the probe's summaries, the replay's, the planner's
windows). The gateway itself keeps mergeable histograms instead (router/state/latency.py)."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    return _interpolated(sorted(values), q)


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Several percentiles of one sample, sorted once."""
    ordered = sorted(values)
    return [_interpolated(ordered, q) for q in qs]


class TimeWindow:
    """(time, value) pairs, dropped from the front once older than a horizon, with their sum
    and their values in order kept as they come and go: a mean or a percentile costs O(1),
    not a pass over the window (the planner asks for both on every arrival that finds a full
    pool, which made a busy trace quadratic)."""

    def __init__(self) -> None:
        self._items: deque[tuple[float, float]] = deque()
        self._ordered: list[float] = []
        self._sum = 0.0

    def __len__(self) -> int:
        return len(self._items)

    def append(self, at: float, value: float) -> None:
        self._items.append((at, value))
        bisect.insort(self._ordered, value)
        self._sum += value

    def drop_before(self, horizon: float) -> None:
        while self._items and self._items[0][0] < horizon:
            _, value = self._items.popleft()
            del self._ordered[bisect.bisect_left(self._ordered, value)]
            self._sum -= value

    def mean(self) -> float:
        return self._sum / len(self._items)

    def percentile(self, q: float) -> float:
        return _interpolated(self._ordered, q)


def _interpolated(ordered: Sequence[float], q: float) -> float:
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
