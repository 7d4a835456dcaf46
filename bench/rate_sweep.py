"""Where does the cheapest SLO-meeting plan change from all-serverless to hybrid to
all-dedicated as the traffic grows? `tidegate plan`'s model over the Azure code and conv slices
at rising `--scale-rate`, next to the utilization break-even of the economics formula
(router/economics/cost.py: `break_even_utilization`).

For each rate it models all-serverless and, around the replicas the mean prefill load needs,
dedicated pools with 16 or 64 slots per replica, and prints the cheapest plan meeting the SLO
for 95% of requests, what kind it is (all-dedicated: under 1% spilled), and the break-even: the
share of a replica's prefill capacity that must be busy before a dedicated task costs what a
serverless one does.

    python -m bench.rate_sweep [--rates 1 2 5 10 20 50 100] [--slice code conv] [--traces DIR]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress

from bench.plan_vs_replay import SLICES, TRACES
from router.economics.cost import break_even_utilization, token_cost_usd
from router.offline.calibration import DEDICATED, SERVERLESS
from router.offline.planner.model import Plan, System
from router.offline.planner.sweep import choose, evaluate
from router.offline.replay import load, scale_rate, window

MINUTES = 20.0
TARGET = 0.95


def kind(result: dict[str, Any]) -> str:
    if result["settings"]["replicas"] == 0:
        return "all-serverless"
    return "all-dedicated" if result["spill_share"] < 0.01 else "hybrid"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[1, 2, 5, 10, 20, 50, 100])
    parser.add_argument("--slice", nargs="+", choices=sorted(SLICES), default=sorted(SLICES))
    parser.add_argument("--traces", type=Path, default=TRACES)
    args = parser.parse_args()
    d, s = DEDICATED["deepseek-r1-h200"], SERVERLESS["deepseek-serverless"]
    system = System(d, s)
    started = time.perf_counter()
    lines = []
    for name in args.slice:
        file, start = SLICES[name]
        base = window(load(args.traces / file), start, MINUTES)
        mean_in = statistics.fmean(a.input_tokens for a in base)
        mean_out = statistics.fmean(a.output_tokens for a in base)
        serverless_task = token_cost_usd(mean_in, mean_out, s.usd_per_mtok_in, s.usd_per_mtok_out)
        capacity_per_hour = d.prefill_tokens_per_s / mean_in * 3600  # prefill-bound tasks per replica
        threshold = break_even_utilization(d.usd_per_hour, capacity_per_hour, serverless_task)
        lines.append(
            f"\n{name}: mean prompt {mean_in:,.0f} tokens, answer {mean_out:,.0f}; one replica prefills "
            f"{capacity_per_hour:,.0f} such tasks an hour; a serverless task costs ${serverless_task:.6f}; "
            f"break-even utilization {threshold:.0%} of a replica's prefill capacity"
        )
        lines.append(
            "| rate x | requests | prefill load (replicas) | cheapest meeting the SLO | kind | $/SLO task "
            "| SLO met | all-serverless $/task | its SLO met |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        with Progress(transient=True) as progress:
            bar = progress.add_task(f"{name}: rates", total=len(args.rates))
            for rate in args.rates:
                rows = scale_rate(base, rate, seed=1)
                load_replicas = sum(a.input_tokens for a in rows) / (MINUTES * 60) / d.prefill_tokens_per_s
                counts = {max(1, math.floor(load_replicas * f)) for f in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)}
                plans = [Plan(0)] + [Plan(r, c) for r in sorted(counts | {1}) for c in (16, 64)]
                results = [evaluate(rows, p, system, slo_ttft_ms=2000.0, span_s=MINUTES * 60) for p in plans]
                verdict = choose(results, TARGET)
                serverless = results[0]
                chosen = next((r for r in results if r["plan"] == verdict["chosen"]), None)
                lines.append(
                    f"| {rate:g} | {len(rows):,} | {load_replicas:.2f} | "
                    + (
                        f"{chosen['plan']} | {kind(chosen)} | {chosen['cost_per_slo_success_usd']:.6f} "
                        f"| {chosen['slo_attainment']:.1%} "
                        if chosen
                        else "none | - | - | - "
                    )
                    + f"| {serverless['cost_per_slo_success_usd']:.6f} | {serverless['slo_attainment']:.1%} |"
                )
                progress.advance(bar)
    print(f"python -m bench.rate_sweep  (SLO: TTFT <= 2 s for {TARGET:.0%} of requests)")
    print("\n".join(lines))
    print(f"\nmodelled in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
