"""Plans with a schedule: a dedicated replica count for each hour of the week, the
`schedule` of a dedicated endpoint's config (`tidegate plan --schedule`).

A fixed pool pays for its quiet hours; with a daily shape the cheapest plan often runs
replicas in the busy hours and none at night. The trace is cut at wall-clock hours; each
hour is modelled on its own for every candidate count (tidegate/offline/planner/model.py, the
best of the candidate slot counts), and a dynamic programme picks the count per hour that
costs least over the whole trace while each hour meets the SLO, paying a provisioning charge
(`provision_s` of a replica's price) every time a replica is added. An hour starts empty
(no queue, no warm serverless route carried over): the hours are independent.

The same per-hour figures price every fixed count, so the schedule is compared like for like
with all-serverless, the best fixed pool and the smallest pool under which nothing spills
(all-dedicated).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from router.economics.schedule import HOUR_S, WEEK_HOURS, by_time_of_day
from tidegate.offline.planner.plans import Plan, System
from tidegate.offline.planner.sweep import evaluate
from tidegate.offline.planner.workers import in_processes
from tidegate.offline.replay import Arrival

SERVERLESS_KEEP_WARM_S = 30.0  # under the calibrations' 60 s scale-to-zero


@dataclass(frozen=True, slots=True)
class HourOption:
    """One replica count over one hour: what the model predicts for it."""

    replicas: int
    cost_usd: float
    dedicated_usd: float
    serverless_usd: float
    requests: int
    slo_successes: float
    spill_share: float
    meets: bool
    plan: str
    slots_per_replica: int | None = None  # the plan's max_concurrency per replica (None: no pool)


def hours(rows: Sequence[Arrival], first_offset_s: float) -> list[list[Arrival]]:
    """The rows cut at wall-clock hours (the first row `first_offset_s` into its hour), each
    hour's times from its own start; hours without rows are empty lists."""
    if not rows:
        return []
    count = int((first_offset_s + rows[-1].at_s) // HOUR_S) + 1
    found: list[list[Arrival]] = [[] for _ in range(count)]
    for a in rows:
        at = first_offset_s + a.at_s
        index = int(at // HOUR_S)
        found[index].append(Arrival(at - index * HOUR_S, a.input_tokens, a.output_tokens))
    return found


def hour_options(
    rows: Sequence[Arrival],
    counts: Sequence[int],
    concurrency: Sequence[int],
    system: System,
    *,
    slo_ttft_ms: float,
    target: float,
) -> dict[int, HourOption]:
    """Per replica count, the best of the slot counts over one hour (meeting the target
    first, then the cheapest)."""
    found: dict[int, HourOption] = {}
    for replicas in counts:
        # serverless alone, also kept warm: a quiet hour's cold loads are not a reason for a replica
        plans = (
            [Plan(0), Plan(0, keep_warm_s=SERVERLESS_KEEP_WARM_S)]
            if replicas == 0
            else [Plan(replicas, c) for c in concurrency]
        )
        options = [_option(rows, plan, system, slo_ttft_ms, target) for plan in plans]
        found[replicas] = min(options, key=lambda o: (not o.meets, o.cost_usd))
    return found


def _option(
    rows: Sequence[Arrival], plan: Plan, system: System, slo_ttft_ms: float, target: float
) -> HourOption:
    dedicated_usd = plan.replicas * system.dedicated.usd_per_hour
    slots = plan.max_concurrency if plan.replicas else None
    if not rows:
        return HourOption(
            plan.replicas, dedicated_usd, dedicated_usd, 0.0, 0, 0.0, 0.0, True, plan.label, slots
        )
    r = evaluate(rows, plan, system, slo_ttft_ms=slo_ttft_ms, span_s=HOUR_S)
    attainment = float(r["slo_attainment"] or 0.0)
    return HourOption(
        replicas=plan.replicas,
        cost_usd=float(r["cost_usd"]),
        dedicated_usd=float(r["cost_usd"]) - float(r["serverless_usd"]),
        serverless_usd=float(r["serverless_usd"]),
        requests=len(rows),
        slo_successes=attainment * len(rows),
        spill_share=float(r["spill_share"] or 0.0),
        meets=attainment >= target,
        plan=plan.label,
        slots_per_replica=slots,
    )


def choose_counts(
    options: Sequence[dict[int, HourOption]], provision_usd: float, floor: int = 0
) -> list[int]:
    """The count per hour that costs least over the trace, each hour meeting the SLO where any
    count does (else the hour's best attainment), adding a replica costing `provision_usd`.
    No hour keeps a replica that costs more than serverless meeting the SLO in that hour (a
    replica kept to save its next provisioning is not one the traffic asked for), and every
    hour has at least `floor` replicas (a stated warm floor)."""
    allowed = [_allowed(hour, floor) for hour in options]
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for hour, counts in zip(options, allowed, strict=True):
        step: dict[int, tuple[float, list[int]]] = {}
        for r in counts:
            cost, path = min(
                (
                    (c + hour[r].cost_usd + provision_usd * max(0, r - prev), p)
                    for prev, (c, p) in best.items()
                ),
                key=lambda found: found[0],
            )
            step[r] = (cost, [*path, r])
        best = step
    return min(best.values(), key=lambda found: found[0])[1]


def _allowed(hour: dict[int, HourOption], floor: int = 0) -> list[int]:
    above = {r: o for r, o in hour.items() if r >= floor} or {max(hour): hour[max(hour)]}
    meeting = [r for r, o in above.items() if o.meets]
    if meeting:
        serverless = above.get(0)
        if serverless is not None and serverless.meets:
            return [r for r in meeting if hour[r].cost_usd <= serverless.cost_usd]
        return meeting
    top = max(o.slo_successes for o in above.values())
    return [r for r, o in above.items() if o.slo_successes == top]


def why(hour: dict[int, HourOption], replicas: int, floor: int = 0) -> str:
    """The reason an hour has its count, in words (`tidegate plan --schedule` prints it)."""
    chosen, serverless = hour[replicas], hour.get(0)
    if replicas and replicas <= floor:
        return f"the warm floor of {floor}"
    if serverless is None:
        return f"${chosen.cost_usd:.2f} with {replicas} (no serverless count modelled)"
    if not replicas:
        return (
            f"serverless meets the SLO for ${serverless.cost_usd:.2f}"
            if serverless.meets
            else (
                f"serverless: no count meets the SLO "
                f"({serverless.slo_successes:.0f} of {serverless.requests} in it)"
            )
        )
    if not serverless.meets:
        return f"serverless misses the SLO even kept warm; {replicas} meets it for ${chosen.cost_usd:.2f}"
    return f"${chosen.cost_usd:.2f} with {replicas} against ${serverless.cost_usd:.2f} serverless"


def totals(
    options: Sequence[dict[int, HourOption]], counts: Sequence[int], provision_usd: float
) -> dict[str, Any]:
    """A count per hour's cost, SLO attainment, spill and cost per SLO-successful task."""
    chosen = [hour[r] for hour, r in zip(options, counts, strict=True)]
    added = sum(max(0, b - a) for a, b in zip([0, *counts], counts, strict=False))
    cost = sum(o.cost_usd for o in chosen) + provision_usd * added
    requests = sum(o.requests for o in chosen)
    successes = sum(o.slo_successes for o in chosen)
    return {
        "cost_usd": round(cost, 6),
        "dedicated_usd": round(sum(o.dedicated_usd for o in chosen) + provision_usd * added, 6),
        "serverless_usd": round(sum(o.serverless_usd for o in chosen), 6),
        "requests": requests,
        "slo_attainment": round(successes / requests, 4) if requests else None,
        "cost_per_slo_success_usd": round(cost / successes, 8) if successes else None,
        "replica_hours": sum(counts),
        "max_spill_share": max((o.spill_share for o in chosen), default=0.0),
    }


def compare(
    options: Sequence[dict[int, HourOption]], counts: Sequence[int], provision_usd: float, target: float
) -> dict[str, dict[str, Any] | None]:
    """The schedule against the pure strategies on the same per-hour figures: all-serverless,
    the cheapest fixed pool meeting the target, and all-dedicated (the smallest fixed pool
    under which no hour spills over 1%)."""
    fixed = {r: totals(options, [r] * len(options), provision_usd) for r in sorted(options[0])}
    meeting = [t | {"replicas": r} for r, t in fixed.items() if (t["slo_attainment"] or 0) >= target]
    dedicated = [t for t in meeting if t["replicas"] > 0 and t["max_spill_share"] < 0.01]
    return {
        "schedule": totals(options, counts, provision_usd),
        "all_serverless": fixed.get(0),
        "best_fixed": min(meeting, key=lambda t: t["cost_usd"]) if meeting else None,
        "all_dedicated": min(dedicated, key=lambda t: t["replicas"]) if dedicated else None,
    }


def week_counts(counts: Sequence[int], first_hour_of_week: int) -> list[int]:
    """The count for each hour of the week (Monday 00:00 first): the largest chosen for that
    hour over the trace's weeks. An hour the trace does not cover takes the largest chosen at
    the same hour of the days it does (a day's trace: the same count every day)."""
    week: list[int | None] = [None] * WEEK_HOURS
    for i, r in enumerate(counts):
        h = (first_hour_of_week + i) % WEEK_HOURS
        week[h] = max(week[h] or 0, r)
    common = Counter(counts).most_common(1)[0][0] if counts else 0
    return by_time_of_day(week, common)


def slots_per_replica(options: Sequence[dict[int, HourOption]], counts: Sequence[int]) -> int | None:
    """The slots per replica the chosen hours with a pool use most (the config has one
    `max_concurrency`, scaled with the replicas); None when no hour has a pool."""
    used = [hour[r].slots_per_replica for hour, r in zip(options, counts, strict=True) if r > 0]
    found = [s for s in used if s is not None]
    return Counter(found).most_common(1)[0][0] if found else None


def plan_hours(
    per_hour: Sequence[Sequence[Arrival]],
    counts: Sequence[int],
    concurrency: Sequence[int],
    system: System,
    *,
    slo_ttft_ms: float,
    target: float,
    progress: Callable[[int], None] = lambda _: None,
    jobs: int = 1,
) -> list[dict[int, HourOption]]:
    """Every hour's options, in order, `jobs` processes at once (each hour is modelled alone)."""
    one = functools.partial(hour_options, slo_ttft_ms=slo_ttft_ms, target=target)
    return in_processes(one, per_hour, jobs, progress=progress, shared=(counts, concurrency, system))
