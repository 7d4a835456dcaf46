"""A model's traffic shape over a window: what the field notes say to measure before choosing
dedicated, serverless or both (docs/economics.md).

Everything is computed from the shared per-slice counters (router/state/latency.py), so it
covers every replica. Concurrency is the mean number of requests in flight within a slice
(busy time / slice length): `peak` is the busiest slice's mean, not an instantaneous peak, and
it says so. A burst is a run of slices whose mean concurrency is over the model's dedicated
capacity.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from router.state.latency import Counts, add_counts

Series = Sequence[tuple[int, Counts]]


def merged_series(per_route: Sequence[Series]) -> list[tuple[int, Counts]]:
    """Several routes' series (same slices) summed slice by slice."""
    if not per_route:
        return []
    out: list[tuple[int, Counts]] = [(start, {}) for start, _ in per_route[0]]
    for series in per_route:
        for i, (_, counts) in enumerate(series):
            add_counts(out[i][1], counts)
    return out


def traffic_shape(series: Series, step_s: int, dedicated_capacity: int) -> dict[str, Any]:
    """The shape of one model's traffic from its routes' merged series."""
    if not series:
        return {"slices": 0}
    requests = [c.get("requests", 0.0) for _, c in series]
    concurrency = [c.get("busy_ms", 0.0) / 1000 / step_s for _, c in series]
    total = sum(requests)
    per_minute = [r * 60 / step_s for r in requests]
    totals: Counts = {}
    for _, counts in series:
        add_counts(totals, counts)
    bursts = _bursts(concurrency, dedicated_capacity, step_s) if dedicated_capacity else []
    return {
        "slice_s": step_s,
        "slices": len(series),
        "requests": int(total),
        "requests_per_s": round(total / (len(series) * step_s), 4),
        "requests_per_minute": {
            "median": round(statistics.median(per_minute), 2),
            "peak": round(max(per_minute), 2),
        },
        "concurrency": {
            "mean": round(statistics.fmean(concurrency), 3),
            "median": round(statistics.median(concurrency), 3),
            "peak_slice_mean": round(max(concurrency), 3),
        },
        "zero_traffic_percent": round(100 * sum(1 for r in requests if r == 0) / len(requests), 2),
        "tokens_per_request": {
            "input": round(totals.get("tokens_in", 0.0) / total, 1) if total else None,
            "output": round(totals.get("tokens_out", 0.0) / total, 1) if total else None,
        },
        "retries_per_request": round(totals.get("retries", 0.0) / total, 4) if total else None,
        "dedicated_capacity": dedicated_capacity,
        "bursts": {
            "count": len(bursts),
            "longest_s": max(bursts, default=0),
            "mean_s": round(statistics.fmean(bursts), 1) if bursts else 0,
        },
        "by_hour_utc": _by(series, "%H", 24),
        "by_weekday_utc": _by(series, "%w", 7),
    }


def _bursts(concurrency: Sequence[float], capacity: int, step_s: int) -> list[int]:
    """Durations (s) of the runs of slices over `capacity`."""
    runs, length = [], 0
    for value in concurrency:
        if value > capacity:
            length += 1
        elif length:
            runs.append(length * step_s)
            length = 0
    if length:
        runs.append(length * step_s)
    return runs


def _by(series: Series, field: str, buckets: int) -> list[int]:
    """Requests per hour of day (UTC, `%H`) or day of week (`%w`, Sunday first)."""
    out = [0] * buckets
    for start, counts in series:
        out[int(datetime.fromtimestamp(start, UTC).strftime(field))] += int(counts.get("requests", 0.0))
    return out
