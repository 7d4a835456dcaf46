"""A dedicated endpoint's `schedule` (a replica count per hour of the week) written as config,
and the report's first-order schedule from live traffic.

`tidegate plan --schedule` chooses the counts by modelling every hour against the SLO
(tidegate/offline/planner/schedule.py). The economics report (`tidegate report`, `GET
/admin/report`) has no model of the engine, so it reads the window by the break-even rule
instead: in an hour of the week, the r-th replica pays when the demand left for it (the model's
mean requests in flight that hour, every route's, in replicas' worth of slots, less the r - 1
replicas before it) keeps it busier than the break-even utilization. Both write the counts
with `config_schedule`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from router.config import WEEKDAYS

HOUR_S = 3600.0
WEEK_HOURS = 168
N = TypeVar("N", int, float)


def config_schedule(week: Sequence[int]) -> tuple[int, list[dict[str, Any]]]:
    """The base `replicas` (the most common count) and the `schedule` entries for the other
    hours: one window per run of equal hours within a day, days with the same window merged."""
    base = Counter(week).most_common(1)[0][0]
    windows: dict[tuple[int, int, int], list[str]] = {}
    for day in range(7):
        hour = 0
        while hour < 24:
            r = week[day * 24 + hour]
            end = hour
            while end < 24 and week[day * 24 + end] == r:
                end += 1
            if r != base:
                for start, stop in _split_whole_day(hour, end):
                    windows.setdefault((start, stop, r), []).append(WEEKDAYS[day])
            hour = end
    entries = [
        {"start": f"{start:02d}:00", "end": f"{stop % 24:02d}:00", "replicas": r}
        | ({} if len(days) == 7 else {"days": days})
        for (start, stop, r), days in sorted(windows.items())
    ]
    return base, entries


def _split_whole_day(start: int, end: int) -> list[tuple[int, int]]:
    """A window of a whole day cannot be written 00:00-00:00 (an empty window): two halves."""
    return [(0, 12), (12, 24)] if (start, end) == (0, 24) else [(start, end)]


def by_time_of_day(week: Sequence[N | None], missing: N) -> list[N]:
    """Each hour of the week as given; an hour not given (None) takes the largest given at the
    same time of day, else `missing` (a trace or window shorter than a week repeats its days)."""
    largest: dict[int, N] = {}
    for h, value in enumerate(week):
        if value is not None:
            largest[h % 24] = max(largest.get(h % 24, value), value)
    return [value if value is not None else largest.get(h % 24, missing) for h, value in enumerate(week)]


def weekly_demand(series: Sequence[tuple[int, float]]) -> list[float | None]:
    """Per hour of the week (Monday 00:00 UTC first), the mean requests in flight over the
    window's hours at that time, from (slice start, busy seconds) pairs; None for an hour of
    the week the window does not cover."""
    busy: dict[int, float] = {}
    seen: dict[int, set[int]] = {}
    for start, busy_s in series:
        when = datetime.fromtimestamp(start, UTC)
        hour = when.weekday() * 24 + when.hour
        busy[hour] = busy.get(hour, 0.0) + busy_s
        seen.setdefault(hour, set()).add(int(start // HOUR_S))
    return [busy[h] / (HOUR_S * len(seen[h])) if h in seen else None for h in range(WEEK_HOURS)]


def break_even_counts(
    demand: Sequence[float | None], slots_per_replica: float, break_even: float
) -> list[int]:
    """Replicas worth running in each hour of the week by the break-even rule; an hour the
    window did not cover takes the busiest covered hour at the same time of day."""
    counts = []
    for in_flight in by_time_of_day(demand, 0.0):
        replicas_worth = in_flight / slots_per_replica
        counts.append(math.floor(replicas_worth - break_even) + 1 if replicas_worth >= break_even else 0)
    return counts


def recommended_schedule(
    endpoint_name: str,
    slots_per_replica: float,
    break_even: float | None,
    series: Sequence[tuple[int, float]],
) -> tuple[dict[str, Any], str] | None:
    """The report's schedule for a model's first dedicated endpoint, and its recommendation
    line; None when the break-even is unknown or over 100% (no hour can pay)."""
    if break_even is None or break_even >= 1 or slots_per_replica <= 0 or not series:
        return None
    week = break_even_counts(weekly_demand(series), slots_per_replica, break_even)
    base, entries = config_schedule(week)
    paying = sum(1 for r in week if r > 0)
    line = (
        f"by the break-even rule ({break_even:.0%} utilization) over this window, {endpoint_name} pays "
        f"for itself in {paying} of the week's 168 hours (up to {max(week)} replica(s)): "
        f"replicas: {base}, schedule: {len(entries)} window(s) (economics.schedule); "
        "`tidegate plan TRACE --from URL --schedule` models it against the SLO"
    )
    return {"rule": "break_even", "break_even_utilization": break_even, "week": week,
            "config": {"replicas": base, "schedule": entries}}, line  # fmt: skip
