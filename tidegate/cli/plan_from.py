"""`tidegate plan TRACE --from URL --window 7d`: plan over a running gateway's own traffic.

The gateway's stored rollups (GET /admin/report: every replica's counts, per slice) give each
UTC hour's requests for the model; TRACE gives what happens inside an hour (request sizes,
bursts and idle minutes), laid the way `tidegate trace synth` lays it
(tidegate/offline/synth.py `synthesize_hours`). So the volume and its daily and weekly shape are
the gateway's, measured; the in-hour structure is the trace's. The window must be within the
gateway's `state.retention_s` (a week needs `retention_s: 604800`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from policies.types import route_key
from router.cli.admin_client import call_admin
from router.economics.schedule import HOUR_S
from tidegate.offline.replay import Arrival
from tidegate.offline.synth import synthesize_hours


def hourly_requests(report: dict[str, Any], model: str) -> tuple[datetime, list[float]]:
    """The model's requests per UTC hour, summed over its routes, from the window's first hour
    with traffic to its last (quiet hours between them 0); and when the first of them starts."""
    routes = (report.get("models") or {}).get(model, {}).get("routes")
    if not routes:
        raise ValueError(f"the gateway reports no routes for model {model!r}")
    series = report.get("series", {}).get("routes", {})
    by_hour: dict[int, float] = {}
    for name in routes:
        for start, counts in series.get(route_key(model, name), []):
            hour = int(start // HOUR_S)
            by_hour[hour] = by_hour.get(hour, 0.0) + float(counts.get("requests", 0.0))
    busy = [h for h, requests in by_hour.items() if requests > 0]
    if not busy:
        raise ValueError(f"no requests for model {model!r} in the window")
    first, last = min(busy), max(busy)  # from the first hour with traffic to the last
    hours = [by_hour.get(h, 0.0) for h in range(first, last + 1)]
    return datetime.fromtimestamp(first * HOUR_S, UTC).replace(tzinfo=None), hours


def gateway_rows(
    url: str, admin_key: str, model: str, window: str, source: list[Arrival], *, seed: int
) -> tuple[datetime, list[Arrival]]:
    """The rows to plan over, timed from the first hour's start, and that start (UTC)."""
    report = call_admin("GET", url, f"/admin/report?window={window}&model={model}", admin_key, timeout=120)
    start, hours = hourly_requests(report, model)
    rows: list[Arrival] = []
    for hour in synthesize_hours(source, hours, seed=seed):
        rows.extend(hour)
    return start, rows
