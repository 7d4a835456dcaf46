"""Latency histograms that merge across processes: log buckets per route, metric and time slice.

A value (milliseconds) lands in the log bucket that ddsketch's logarithmic mapping gives it
(relative accuracy 1%: a bucket spans 2%, and the quantile reported is within 1% of a value of
that rank). A histogram is a map bucket -> count plus the exact sum and sum of squares, so two
histograms merge by adding counts: in Redis that is HINCRBY from any number of replicas, and
p50/p95/p99 over the last N seconds is the merge of the time slices it spans.

Time slices are `SLICE_S` seconds of wall-clock time (replicas are assumed NTP-synced; a
skew of a second moves a few samples into the next slice, it does not lose them).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

from policies.types import Figures

RELATIVE_ACCURACY = 0.01
SLICE_S = 10
# Slice lengths the shared store keeps: 10 s slices rolled up into 1 min and 1 h ones, so a
# window of any length reads at most _MAX_SLICES slices per route and metric.
ROLLUPS_S = (SLICE_S, 60, 3600)
_MAX_SLICES = 360
_MIN_MS = 0.001  # the mapping needs a positive value; nothing we time is shorter than 1 µs
MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)


class Metric(StrEnum):
    TTFT = "ttft"  # attempt sent -> first output event (streams)
    E2E = "e2e"  # attempt sent -> last byte (successful answers)
    ITL = "itl"  # mean gap between output events of one stream
    # a served answer's attempt-sent -> last byte over its output tokens (ms per token): a
    # latency every answer has, streamed or not (the "normalized latency" of the vLLM paper)
    E2E_PER_TOKEN = "e2e_tok"
    QUEUE = "queue"  # time a request waited in line for a dedicated slot (when it waited)
    TOKENS_IN = "tok_in"  # a served answer's input tokens (not a time: a count, same sketch)
    TOKENS_OUT = "tok_out"  # ... and output tokens


def slice_of(wall_s: float, step_s: int = SLICE_S) -> int:
    """The start (Unix seconds) of the `step_s`-long time slice `wall_s` falls in."""
    return int(wall_s // step_s) * step_s


def resolution_for(window_s: float) -> int:
    """The finest slice length (one of ROLLUPS_S) that covers `window_s` in at most
    _MAX_SLICES slices: 10 s up to an hour, 1 min up to 6 h, 1 h beyond."""
    for step in ROLLUPS_S:
        if window_s / step <= _MAX_SLICES:
            return step
    return ROLLUPS_S[-1]


@dataclass(slots=True)
class Histogram:
    counts: Counter[int] = field(default_factory=Counter)
    total: float = 0.0
    total_sq: float = 0.0

    @property
    def samples(self) -> int:
        return sum(self.counts.values())

    def add(self, value_ms: float, count: int = 1) -> None:
        value = max(value_ms, _MIN_MS)
        self.counts[MAPPING.key(value)] += count
        self.total += value * count
        self.total_sq += value * value * count

    def merge(self, other: Histogram) -> None:
        self.counts.update(other.counts)
        self.total += other.total
        self.total_sq += other.total_sq

    def figures(self) -> Figures | None:
        n = self.samples
        if n == 0:
            return None
        sketch = DDSketch(RELATIVE_ACCURACY)
        for key, count in self.counts.items():
            sketch.add(MAPPING.value(key), count)
        mean = self.total / n
        std = math.sqrt(max(self.total_sq / n - mean * mean, 0.0))
        p50, p95, p99 = (float(sketch.get_quantile_value(q) or 0.0) for q in (0.5, 0.95, 0.99))
        return Figures(n, p50, p95, p99, mean, std / mean if mean > 0 else 0.0)

    # The wire form (Redis hash fields): bucket keys as decimal strings, plus the two sums.
    SUM_FIELD = "s"
    SQUARES_FIELD = "q"

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes]) -> Histogram:
        histogram = cls()
        histogram.add_fields(fields)
        return histogram

    def add_fields(self, fields: Mapping[bytes, bytes]) -> None:
        """Merge a stored slice's hash in place (a window read adds hundreds of them)."""
        counts = self.counts
        for name, value in fields.items():
            if name == b"s":
                self.total += float(value)
            elif name == b"q":
                self.total_sq += float(value)
            else:
                bucket = int(name)
                counts[bucket] = counts.get(bucket, 0) + int(value)


SliceKey = tuple[str, Metric, int]  # (route, metric, slice start)


class LatencyBook:
    """Histograms per (route, metric, slice), in one process. Not thread-safe (one loop).

    The memory store keeps its whole window here; the Redis store uses one as the buffer it
    drains to Redis in the background.
    """

    def __init__(self) -> None:
        self._slices: dict[SliceKey, Histogram] = {}

    def observe(self, route: str, metric: Metric, value_ms: float, wall_s: float) -> None:
        key = (route, metric, slice_of(wall_s))
        histogram = self._slices.get(key)
        if histogram is None:
            histogram = self._slices[key] = Histogram()
        histogram.add(value_ms)

    def drain(self) -> dict[SliceKey, Histogram]:
        """Hand over every slice and start empty."""
        slices, self._slices = self._slices, {}
        return slices

    def window(self, route: str, metric: Metric, wall_s: float, window_s: float) -> Histogram:
        merged = Histogram()
        for start in slices_in_window(wall_s, window_s):
            histogram = self._slices.get((route, metric, start))
            if histogram is not None:
                merged.merge(histogram)
        return merged

    def forget_before(self, wall_s: float) -> None:
        for key in [k for k in self._slices if k[2] + SLICE_S <= wall_s]:
            del self._slices[key]


Counts = dict[str, float]


def add_counts(into: Counts, counts: Mapping[str, float]) -> None:
    for name, value in counts.items():
        into[name] = into.get(name, 0.0) + value


class CountBook:
    """Counters per (route, slice): requests, errors, outcomes, reasons, tokens, busy time.
    Merged like the histograms, by summing (HINCRBYFLOAT in Redis)."""

    def __init__(self) -> None:
        self._slices: dict[tuple[str, int], Counts] = {}

    def add(self, route: str, counts: Mapping[str, float], wall_s: float) -> None:
        add_counts(self._slices.setdefault((route, slice_of(wall_s)), {}), counts)

    def drain(self) -> dict[tuple[str, int], Counts]:
        slices, self._slices = self._slices, {}
        return slices

    def window(self, route: str, wall_s: float, window_s: float) -> Counts:
        merged: Counts = {}
        for start in slices_in_window(wall_s, window_s):
            add_counts(merged, self._slices.get((route, start), {}))
        return merged

    def series(self, route: str, wall_s: float, window_s: float, step_s: int) -> list[tuple[int, Counts]]:
        """The window's counters in `step_s`-long slices, oldest first (empty slices included)."""
        out: list[tuple[int, Counts]] = []
        for start in slices_in_window(wall_s, window_s, step_s):
            merged: Counts = {}
            for fine in range(start, start + step_s, SLICE_S):
                add_counts(merged, self._slices.get((route, fine), {}))
            out.append((start, merged))
        return out

    def forget_before(self, wall_s: float) -> None:
        for key in [k for k in self._slices if k[1] + SLICE_S <= wall_s]:
            del self._slices[key]


def rolled_up(slices: Mapping[SliceKey, Histogram], step_s: int) -> dict[SliceKey, Histogram]:
    """`slices` merged into `step_s`-long slices."""
    out: dict[SliceKey, Histogram] = {}
    for (route, metric, start), histogram in slices.items():
        key = (route, metric, slice_of(start, step_s))
        merged = out.get(key)
        if merged is None:
            merged = out[key] = Histogram()
        merged.merge(histogram)
    return out


def rolled_up_counts(slices: Mapping[tuple[str, int], Counts], step_s: int) -> dict[tuple[str, int], Counts]:
    """Counter `slices` summed into `step_s`-long slices."""
    out: dict[tuple[str, int], Counts] = {}
    for (route, start), counts in slices.items():
        add_counts(out.setdefault((route, slice_of(start, step_s)), {}), counts)
    return out


def window_start(wall_s: float, window_s: float) -> int:
    """Where the window (wall_s - window_s, wall_s] starts once rounded out to whole slices of
    its resolution (`resolution_for`): the same span for every store and for the report."""
    return slice_of(wall_s - window_s + 1e-9, resolution_for(window_s))


def slices_in_window(wall_s: float, window_s: float, step_s: int = SLICE_S) -> range:
    """Starts of the `step_s`-long slices (step_s <= the window's resolution) that cover the
    window from `window_start`: it holds between window_s and window_s + its resolution."""
    return range(window_start(wall_s, window_s), slice_of(wall_s, step_s) + 1, step_s)


def figures_by_route(
    windows: Iterable[tuple[str, Histogram]],
) -> dict[str, Figures]:
    """Figures for each route whose window holds samples."""
    out: dict[str, Figures] = {}
    for route, histogram in windows:
        figures = histogram.figures()
        if figures is not None:
            out[route] = figures
    return out
