"""Latency histograms and counters in one process, sliced by time like the Redis store's, and
the windowed figures the snapshot carries (recomputed every second)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from policies.types import Snapshot
from router.state.latency import (
    CountBook,
    Counts,
    Histogram,
    LatencyBook,
    Metric,
    figures_by_route,
    resolution_for,
)

_MAX_KEEP_S = 3600.0  # in-process history is bounded: an hour of slices at most


class MemorySeries:
    def __init__(self, routes: Sequence[str], window_s: float, retention_s: float) -> None:
        self._book = LatencyBook()
        self._counts = CountBook()
        self._keep_s = min(max(retention_s, window_s), _MAX_KEEP_S)
        self._routes = tuple(routes)
        self._window_s = window_s
        self._figures = Snapshot(now=0.0)

    def observe(self, route: str, metric: Metric, value_ms: float) -> None:
        self._book.observe(route, metric, value_ms, time.time())

    def count(self, route: str, counts: Mapping[str, float]) -> None:
        self._counts.add(route, counts, time.time())

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]:
        wall = time.time()
        return {route: self._counts.window(route, wall, window_s) for route in routes}

    async def counts_series(
        self, routes: Sequence[str], window_s: float
    ) -> tuple[int, dict[str, list[tuple[int, Counts]]]]:
        wall = time.time()
        step = resolution_for(window_s)
        return step, {route: self._counts.series(route, wall, window_s, step) for route in routes}

    async def latency_window(
        self, routes: Sequence[str], metric: Metric, window_s: float
    ) -> dict[str, Histogram]:
        wall = time.time()
        return {route: self._book.window(route, metric, wall, window_s) for route in routes}

    async def refresh(self) -> None:
        """Recompute the windowed figures and drop slices older than the window."""
        wall = time.time()
        self._book.forget_before(wall - self._keep_s - 60)
        self._counts.forget_before(wall - self._keep_s - 60)
        ttft = await self.latency_window(self._routes, Metric.TTFT, self._window_s)
        e2e = await self.latency_window(self._routes, Metric.E2E, self._window_s)
        self._figures = Snapshot(
            now=time.monotonic(), ttft=figures_by_route(ttft.items()), e2e=figures_by_route(e2e.items())
        )

    def snapshot_fields(self) -> dict[str, Any]:
        return {"ttft": self._figures.ttft, "e2e": self._figures.e2e}
