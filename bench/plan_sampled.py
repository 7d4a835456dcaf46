"""Does the sampled planner (tidegate/offline/planner/sampled.py) say what the exact one says?
Both over the same 20-minute slices of the Azure traces, the default grid, plan for plan: SLO
attainment (points) and cost per SLO-successful task (%), each the mean over `--seeds` seeds,
and next to them the exact model's own spread across those seeds (a scale-to-zero route's
cold loads last 10-90 s, so one 20-minute run of a bursty slice moves by many points with the
seed alone). Also the same over the plans the choice turns on (the exact model's attainment at
least 90%), whether both choose the same plan, and the time each took. `--floor` also puts the
exact model against itself on as many other seeds: the difference noise alone makes.

    python -m bench.plan_sampled [--slice code:1 conv:10] [--slice-s 60] [--seeds 5] [--floor]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.plan_vs_replay import TRACES
from tidegate.offline.calibration import DEDICATED, PARTNERS, SERVERLESS
from tidegate.offline.planner.plans import System
from tidegate.offline.planner.sampled import sample, sweep_sampled
from tidegate.offline.planner.sweep import Grid, choose, sweep
from tidegate.offline.replay import load, scale_rate

FILES = {"code": "AzureLLMInferenceTrace_code_20min.csv", "conv": "AzureLLMInferenceTrace_conv_20min.csv"}
SLO_TTFT_MS = 2000.0
TARGET = 0.95
NEAR = 0.9  # plans the choice turns on: the exact model's mean attainment at least this


def _mean(runs: Sequence[list[dict[str, Any]]], key: str, plan: int) -> float:
    return statistics.fmean(float(run[plan][key] or 0.0) for run in runs)


def _spread(runs: Sequence[list[dict[str, Any]]], plan: int) -> float:
    values = [float(run[plan]["slo_attainment"] or 0.0) for run in runs]
    return (max(values) - min(values)) * 100


def _apart(
    exact: Sequence[list[dict[str, Any]]], other: Sequence[list[dict[str, Any]]]
) -> tuple[list[float], list[float]]:
    """Per plan, |attainment apart| in points and |cost per SLO success apart| in %, of the means."""
    points, costs = [], []
    for i in range(len(exact[0])):
        points.append(abs(_mean(other, "slo_attainment", i) - _mean(exact, "slo_attainment", i)) * 100)
        e, m = (_mean(runs, "cost_per_slo_success_usd", i) for runs in (exact, other))
        costs.append(abs(m / e - 1) * 100 if e else 0.0)
    return points, costs


def compare(name: str, scale: float, args: argparse.Namespace) -> dict[str, Any]:
    rows = scale_rate(load(TRACES / FILES[name]), scale, seed=0)
    calibration = args.calibration
    system = System(DEDICATED[calibration], SERVERLESS[PARTNERS[calibration][0]])
    plans = Grid(ttft_budget_ms=[SLO_TTFT_MS]).plans()
    span = rows[-1].at_s
    started = time.perf_counter()
    exact = [
        sweep(rows, plans, system, slo_ttft_ms=SLO_TTFT_MS, span_s=span, jobs=args.jobs, seed=s)
        for s in range(args.seeds)
    ]
    exact_s = (time.perf_counter() - started) / args.seeds
    started = time.perf_counter()
    part = sample(rows, span, slice_s=args.slice_s, per_stratum=args.per_stratum)
    estimated = [
        sweep_sampled(part, plans, system, slo_ttft_ms=SLO_TTFT_MS, jobs=args.jobs, seed=s)
        for s in range(args.seeds)
    ]
    sampled_s = (time.perf_counter() - started) / args.seeds
    points, costs = _apart(exact, estimated)
    spreads = [_spread(exact, i) for i in range(len(plans))]
    worst = max(range(len(plans)), key=lambda i: points[i])
    near = [i for i in range(len(plans)) if _mean(exact, "slo_attainment", i) >= NEAR]
    found = {}
    if args.floor:  # the exact model against itself on as many other seeds: what noise alone gives
        again = [
            sweep(rows, plans, system, slo_ttft_ms=SLO_TTFT_MS, span_s=span, jobs=args.jobs, seed=s)
            for s in range(args.seeds, 2 * args.seeds)
        ]
        floor_points, floor_costs = _apart(exact, again)
        found = {
            "floor_near_points_max": max((floor_points[i] for i in near), default=0.0),
            "floor_near_cost_pct_max": max((floor_costs[i] for i in near), default=0.0),
        }
    return found | {
        "near_plans": len(near),
        "near_points_max": max((points[i] for i in near), default=0.0),
        "near_cost_pct_max": max((costs[i] for i in near), default=0.0),
        "slice": f"{name} x{scale:g}",
        "requests": len(rows),
        "sample": part.describe(),
        "points_max": max(points),
        "points_median": statistics.median(points),
        "cost_pct_max": max(costs),
        "cost_pct_median": statistics.median(costs),
        "worst_plan": plans[worst].label,
        "exact_seed_spread_at_worst": spreads[worst],
        "exact_seed_spread_max": max(spreads),
        "choice_exact": [choose(run, TARGET)["chosen"] for run in exact],
        "choice_sampled": [choose(run, TARGET)["chosen"] for run in estimated],
        "exact_s": exact_s,
        "sampled_s": sampled_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slice", nargs="+", default=["code:1", "code:5", "conv:1", "conv:10"])
    parser.add_argument("--slice-s", type=float, default=60.0, help="the sample's slice (20 minutes hold 20)")
    parser.add_argument("--per-stratum", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--calibration", choices=sorted(DEDICATED), default="deepseek-r1-h200")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--floor", action="store_true", help="also the exact model against itself on other seeds"
    )
    args = parser.parse_args()
    for spec in args.slice:
        name, _, scale = spec.partition(":")
        found = compare(name, float(scale or 1), args)
        shape = found["sample"]
        print(
            f"{found['slice']} ({found['requests']:,} requests; sample {shape['slices']} of "
            f"{shape['of_slices']} slices, {shape['requests_modelled']:,} requests with warm-ups): "
            f"attainment |sampled - exact| max {found['points_max']:.2f} pt, median "
            f"{found['points_median']:.2f} pt; cost per SLO success max {found['cost_pct_max']:.2f}%, "
            f"median {found['cost_pct_median']:.2f}%; worst {found['worst_plan']!r} (exact's own seed "
            f"spread there {found['exact_seed_spread_at_worst']:.2f} pt, widest {found['exact_seed_spread_max']:.2f}"
            f" pt); chosen exact {found['choice_exact']} sampled {found['choice_sampled']}; "
            f"{found['exact_s']:.1f} s exact, {found['sampled_s']:.1f} s sampled per sweep; "
            f"the {found['near_plans']} plans at >= {NEAR:.0%} (exact): max {found['near_points_max']:.2f} pt, "
            f"{found['near_cost_pct_max']:.2f}%"
            + (
                f" (exact against exact on other seeds: {found['floor_near_points_max']:.2f} pt, "
                f"{found['floor_near_cost_pct_max']:.2f}%)"
                if args.floor
                else ""
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
