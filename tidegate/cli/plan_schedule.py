"""`tidegate plan --schedule`: a dedicated replica count per hour of the week, written as the
endpoint's `replicas` and `schedule` (tidegate/offline/planner/schedule.py does the modelling).

Prints the counts as a week grid, what the schedule costs against all-serverless, the best
fixed pool and all-dedicated (per SLO-successful task, on the same per-hour figures), and the
config lines; writes schedule.json (every hour's cost on each route) to `--out`.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import yaml
from rich.console import Console
from rich.table import Table

from router.config import WEEKDAYS
from router.economics.schedule import HOUR_S, config_schedule
from tidegate.cli.progress import counting
from tidegate.offline.planner.plans import System
from tidegate.offline.planner.schedule import (
    choose_counts,
    compare,
    hours,
    plan_hours,
    slots_per_replica,
    week_counts,
    why,
)
from tidegate.offline.replay import Arrival, detect, first_azure_time


def trace_start(path: Path, fmt: str | None, given: str | None, known: datetime | None = None) -> datetime:
    """When the trace's first row was sent: `--trace-start`, else `known` (a gateway's first
    hour with traffic, for --from), else an Azure CSV's first timestamp, else Monday 00:00 (the
    hours then count from the first row)."""
    if given is not None:
        return datetime.fromisoformat(given)
    if known is not None:
        return known
    first = first_azure_time(path) if (fmt or detect(path)) == "azure" else None
    return first or datetime(2026, 1, 5)  # a Monday


def run(
    args: argparse.Namespace,
    rows: list[Arrival],
    system: System,
    console: Console,
    known: datetime | None = None,
) -> int:
    try:
        start = trace_start(Path(args.trace), args.format, args.trace_start, known)
    except (OSError, ValueError, KeyError) as exc:
        print(f"tidegate plan: --trace-start: {exc}", file=sys.stderr)
        return 2
    offset_s = start.minute * 60 + start.second + start.microsecond / 1e6
    first_hour = start.weekday() * 24 + start.hour
    per_hour = hours(rows, offset_s)
    counts = sorted(set(args.replicas) | {0})
    with counting(console, "modelling hours", len(per_hour)) as advance:
        options = plan_hours(
            per_hour,
            counts,
            args.max_concurrency,
            system,
            slo_ttft_ms=args.slo_ttft_ms,
            target=args.target,
            progress=advance,
            jobs=args.jobs,
        )
    provision_usd = system.dedicated.usd_per_hour * args.provision_s / HOUR_S
    floor = args.warm_floor
    chosen = choose_counts(options, provision_usd, floor)
    week = week_counts(chosen, first_hour)
    base, entries = config_schedule(week)
    slots = slots_per_replica(options, chosen)
    pool = {} if slots is None else {"max_concurrency": slots * max(base, 1)}
    found = {
        "trace": {
            "path": str(args.trace),
            "start": start.isoformat(),
            "hours": len(per_hour),
            "requests": len(rows),
        },
        "slo": {"ttft_ms": args.slo_ttft_ms, "target_attainment": args.target},
        "provision_s": args.provision_s,
        "warm_floor": floor,
        "week": week,
        "config": {"replicas": base, **pool, "schedule": entries},
        "compare": compare(options, chosen, provision_usd, args.target),
        "hours": [
            _hour_row(start, i, opts, r, floor)
            for i, (opts, r) in enumerate(zip(options, chosen, strict=True))
        ],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "schedule.json").write_bytes(orjson.dumps(found, option=orjson.OPT_INDENT_2))
    _print(found)
    print(f"results: {args.out / 'schedule.json'}")
    return 0


def _hour_row(
    start: datetime, index: int, options: dict[int, Any], replicas: int, floor: int
) -> dict[str, Any]:
    o = options[replicas]
    return {
        "hour": index,
        "at": (start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=index)).isoformat(),
        "replicas": replicas,
        "plan": o.plan,
        "requests": o.requests,
        "dedicated_usd": round(o.dedicated_usd, 6),
        "serverless_usd": round(o.serverless_usd, 6),
        "slo_met": o.meets,
        "why": why(options, replicas, floor),
    }


def _print(found: dict[str, Any]) -> None:
    console = Console(width=200)
    grid = Table(title="dedicated replicas per hour (UTC)", show_edge=False)
    grid.add_column("day")
    grid.add_column("00 .. 23")
    for day, name in enumerate(WEEKDAYS):
        grid.add_row(name, " ".join(str(r) for r in found["week"][day * 24 : day * 24 + 24]))
    console.print(grid)
    table = Table(title="the schedule against the pure strategies (same per-hour model)")
    for column in (
        "strategy",
        "cost",
        "$ per SLO-successful task",
        "SLO met",
        "replica-hours",
        "vs schedule",
    ):
        table.add_column(column)
    mine = found["compare"]["schedule"]
    for name, t in found["compare"].items():
        if t is None:
            table.add_row(name.replace("_", " "), "none meets the SLO", "-", "-", "-", "-")
            continue
        per = t["cost_per_slo_success_usd"]
        ratio = (
            f"{per / mine['cost_per_slo_success_usd']:.2f}x"
            if per and mine["cost_per_slo_success_usd"]
            else "-"
        )
        label = name.replace("_", " ") + (f" ({t['replicas']})" if "replicas" in t else "")
        table.add_row(
            label, f"${t['cost_usd']:,.2f}", f"{per:.6f}" if per else "-", f"{t['slo_attainment']:.1%}",
            str(t["replica_hours"]), ratio,
        )  # fmt: skip
    console.print(table)
    print("\nthe dedicated endpoint's config:\n" + yaml.safe_dump(found["config"], sort_keys=False))
