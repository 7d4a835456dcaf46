"""The cost model: what a route costs and what one successful task costs on it.

The field notes' metric (docs/architecture.md): **cost per successful task**.
Dedicated capacity is paid by provisioned time, busy or idle: gpus x $/GPU-hour x hours x
replicas. Serverless is paid per token. Everything here is plain arithmetic on figures the
store recorded, so the report, the tests and the docs use the same formulas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HOURS_PER_MONTH = 720.0
MINUTES_PER_MONTH = HOURS_PER_MONTH * 60
_DAY_S = 86400


def token_cost_usd(
    tokens_in: float, tokens_out: float, usd_per_mtok_in: float, usd_per_mtok_out: float
) -> float:
    return (tokens_in * usd_per_mtok_in + tokens_out * usd_per_mtok_out) / 1e6


def provisioned_cost_usd(gpus: int, gpu_hour_usd: float, replica_seconds: float) -> float:
    """A dedicated endpoint's bill for `replica_seconds` of provisioned time."""
    return gpus * gpu_hour_usd * replica_seconds / 3600.0


def monthly_cost_usd(gpus: int, gpu_hour_usd: float, replicas: float = 1.0) -> float:
    return gpus * gpu_hour_usd * HOURS_PER_MONTH * replicas


def cost_per_task_at(monthly_usd: float, tasks_per_min_capacity: float, utilization: float) -> float:
    """What one task costs on capacity paid by the month and used at `utilization` (0-1):
    the notes' "8% utilized" arithmetic."""
    return monthly_usd / (MINUTES_PER_MONTH * tasks_per_min_capacity * utilization)


def per_success(cost_usd: float, successes: float) -> float | None:
    return cost_usd / successes if successes > 0 else None


def break_even_utilization(
    dedicated_usd_per_hour: float, capacity_tasks_per_hour: float, serverless_usd_per_task: float
) -> float | None:
    """The utilization at which a dedicated task costs what a serverless one does; above it
    dedicated is cheaper. None when it cannot be computed (no capacity or free serverless)."""
    if capacity_tasks_per_hour <= 0 or serverless_usd_per_task <= 0:
        return None
    return dedicated_usd_per_hour / (capacity_tasks_per_hour * serverless_usd_per_task)


@dataclass(frozen=True, slots=True)
class ScheduledReplicas:
    """`replicas` in force from `start_s` to `end_s` seconds after midnight UTC (end < start:
    the window crosses midnight) on the days it starts on (0: Monday; empty: every day)."""

    start_s: int
    end_s: int
    replicas: float
    days: frozenset[int] = frozenset()


def replica_seconds(
    start_wall: float, end_wall: float, replicas: float, schedule: Sequence[ScheduledReplicas] = ()
) -> float:
    """Provisioned replica-seconds between two Unix times: `replicas` outside the schedule's
    windows, each window's own count inside it (exactly, split at the window edges)."""
    if end_wall <= start_wall:
        return 0.0
    total = (end_wall - start_wall) * replicas
    if not schedule:
        return total
    first_day = datetime.fromtimestamp(start_wall, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    day = first_day - timedelta(days=1)  # a window crossing midnight may start the day before
    while day.timestamp() < end_wall:
        midnight = day.timestamp()
        for entry in schedule:
            if entry.days and day.weekday() not in entry.days:
                continue
            begin = midnight + entry.start_s
            end = midnight + entry.end_s + (_DAY_S if entry.end_s <= entry.start_s else 0)
            overlap = min(end, end_wall) - max(begin, start_wall)
            if overlap > 0:
                total += overlap * (entry.replicas - replicas)
        day += timedelta(days=1)
    return total
