"""Latency histograms and counters, shared: samples are buffered in-process and merged into
Redis in the background every `flush_s` (router/state/latency.py has the histograms), so
recording adds no round trip to a request; the merge goes down the background's line (never
the acquires'). Each 10 s slice also adds into its 1 min and 1 h rollups (the flush sums
each key's increments, then sends one MERGE script per key), so a window of any length reads at most a few
hundred slices per route. Fine slices expire after two hours, rollups after `retention_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import RedisError

from router.errors import StoreUnavailable
from router.state.latency import (
    ROLLUPS_S,
    SLICE_S,
    CountBook,
    Counts,
    Histogram,
    LatencyBook,
    Metric,
    add_counts,
    figures_by_route,
    resolution_for,
    rolled_up,
    rolled_up_counts,
    slices_in_window,
)
from router.state.redis.link import RedisLink, RedisRole, log
from router.state.redis.readings import as_mapping
from router.state.redis.scripts import MERGE

_FINE_TTL_S = 2 * 3600  # 10 s slices serve windows up to an hour; the rollups keep the rest
# Window slices read per round trip. A 20-route hour window is 7,220 slices: read at once, their
# replies and merges hold the event loop for tens of ms, and every acquire waits behind them;
# in rounds of this many the loop turns between rounds (bench/acquire_latency.py).
_READ_ROUND = 64

Slices = Mapping[tuple[str, Metric, int], Histogram]
Counted = Mapping[tuple[str, int], Counts]


class RedisSeries(RedisRole):
    """Samples and the windows over them (roles.Samples, roles.Windows); the snapshot's latency
    figures, refreshed every second (`refresh_latency`)."""

    def __init__(self, link: RedisLink) -> None:
        super().__init__(link)
        self._book, self._counts = LatencyBook(), CountBook()

    def observe(self, route: str, metric: Metric, value_ms: float) -> None:
        self._book.observe(route, metric, value_ms, time.time())

    def count(self, route: str, counts: Mapping[str, float]) -> None:
        self._counts.add(route, counts, time.time())

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]:
        windows: dict[str, Counts] = {}
        for route, slices in (await self._window_slices(routes, window_s, self._keys.counts)).items():
            merged: Counts = {}
            for fields in slices:
                add_counts(merged, {k.decode(): float(v) for k, v in fields.items()})
            windows[route] = merged
            await asyncio.sleep(0)  # a route's merge at a time: acquires go on between them
        return windows

    async def counts_series(
        self, routes: Sequence[str], window_s: float
    ) -> tuple[int, dict[str, list[tuple[int, Counts]]]]:
        step = resolution_for(window_s)
        starts = list(slices_in_window(time.time(), window_s, step))
        series: dict[str, list[tuple[int, Counts]]] = {}
        for route, slices in (await self._window_slices(routes, window_s, self._keys.counts)).items():
            series[route] = [
                (start, {k.decode(): float(v) for k, v in fields.items()})
                for start, fields in zip(starts, slices, strict=True)
            ]
            await asyncio.sleep(0)
        return step, series

    async def latency_window(
        self, routes: Sequence[str], metric: Metric, window_s: float
    ) -> dict[str, Histogram]:
        windows: dict[str, Histogram] = {}
        slices_by_route = await self._window_slices(
            routes, window_s, lambda route, start, step: self._keys.latency(route, metric, start, step)
        )
        for route, slices in slices_by_route.items():
            merged = Histogram()
            for fields in slices:
                if fields:
                    merged.add_fields(fields)
            windows[route] = merged
            await asyncio.sleep(0)
        return windows

    async def refresh_latency(self) -> None:
        """Recompute every route's windowed figures from the merged slices in Redis."""
        routes, window_s = self._link.settings.routes, self._link.settings.window_s
        ttft = await self.latency_window(routes, Metric.TTFT, window_s)
        e2e = await self.latency_window(routes, Metric.E2E, window_s)
        self._link.publish(ttft=figures_by_route(ttft.items()), e2e=figures_by_route(e2e.items()))

    async def _window_slices(
        self, routes: Sequence[str], window_s: float, key: Callable[[str, int, int], str]
    ) -> dict[str, list[dict[bytes, bytes]]]:
        """Each route's slice hashes over the last `window_s` seconds (sent at once), at the
        resolution that keeps them at most a few hundred per route. StoreUnavailable when
        Redis cannot be reached."""
        step = resolution_for(window_s)
        starts = slices_in_window(time.time(), window_s, step)
        commands = [("HGETALL", key(route, start, step)) for route in routes for start in starts]
        fields: list[dict[bytes, bytes]] = []
        for at in range(0, len(commands), _READ_ROUND):
            replies = await self._batch.call_all(commands[at : at + _READ_ROUND])
            error = next((r for r in replies if isinstance(r, BaseException)), None)
            if error is not None:
                raise StoreUnavailable(f"Redis is unreachable ({error})") from error
            fields += [as_mapping(reply) for reply in replies]
        per_route = len(starts)
        return {route: fields[i * per_route : (i + 1) * per_route] for i, route in enumerate(routes)}

    async def flush(self) -> None:
        """Merge the buffered samples into Redis; on failure they are lost, counted in the
        warning, rather than piling up while Redis is away."""
        slices = self._book.drain()
        counted = self._counts.drain()
        if not slices and not counted:
            return
        try:
            await self._merge(slices, counted)
        except RedisError:
            lost = sum(h.samples for h in slices.values())
            log.warning("state store: %d latency samples dropped, Redis unreachable", lost)
            raise

    async def _merge(self, slices: Slices, counted: Counted) -> None:
        """One MERGE per key, its increments summed here first (a 10 s slice, its minute and
        its hour): a script of one key lives in one hash slot, so a single Redis and a cluster
        get the same calls (on a cluster each goes to its key's node). Each is a script call
        of its own, so one a restarted Redis did not know is loaded and sent again alone, the
        others not (they were applied)."""
        answers = await asyncio.gather(
            *(
                self._batch.call_script(MERGE, [key], args, lazy=True)
                for key, args in self._merge_calls(slices, counted)
            ),
            return_exceptions=True,
        )
        errors = [answer for answer in answers if isinstance(answer, BaseException)]
        if errors:
            raise errors[0] if isinstance(errors[0], RedisError) else RedisError(str(errors[0]))

    def _rollup_ttl(self, step: int) -> int:
        retention_s = self._link.settings.retention_s
        return retention_s if step > SLICE_S else min(retention_s, _FINE_TTL_S)

    def _merge_calls(self, slices: Slices, counted: Counted) -> list[tuple[str, list[Any]]]:
        """Each key's MERGE arguments: its TTL, its integer increments (histogram buckets),
        then its float ones (a histogram's sums, counters)."""
        calls: list[tuple[str, list[Any]]] = []
        for step in ROLLUPS_S:
            ttl = self._rollup_ttl(step)
            for (route, metric, start), histogram in rolled_up(slices, step).items():
                args: list[Any] = [ttl, len(histogram.counts)]
                for bucket, count in histogram.counts.items():
                    args += [bucket, count]
                args += [
                    Histogram.SUM_FIELD,
                    repr(histogram.total),
                    Histogram.SQUARES_FIELD,
                    repr(histogram.total_sq),
                ]
                calls.append((self._keys.latency(route, metric, start, step), args))
            for (route, start), counts in rolled_up_counts(counted, step).items():
                args = [ttl, 0]
                for name, value in counts.items():
                    args += [name, repr(float(value))]
                calls.append((self._keys.counts(route, start, step), args))
        return calls
