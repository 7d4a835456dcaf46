"""Where does the cheapest SLO-meeting plan change from all-serverless to hybrid to
all-dedicated as the traffic grows? `tidegate plan`'s model over the Azure code and conv slices
at rising `--scale-rate`, for one calibration and its API price, next to the utilization
break-even of the economics formula (router/economics/cost.py: `break_even_utilization`).

For each rate it models all-serverless and, around the replicas the mean load needs (the
engine's additive capacity: prefill and decode share its steps), dedicated pools with 16, 32 or
64 slots per replica (spilling at once, or waiting up to 1 s for a slot) or predicted-TTFT
admission at 1.5 s up to the engine's own `max_num_seqs`, each
with and without a serverless route kept warm every 30 s (a burst after an idle gap otherwise
waits out a cold load), and
prints the cheapest plan of each kind meeting the SLO for 95% of requests (all-dedicated: under
1% spilled), the overall choice, and how it compares with the cheaper pure strategy.
`--plot` draws cost per SLO-successful task against the daily volume, one panel per slice:
the crossover plots of docs/economics.md.

    python -m bench.rate_sweep --calibration llama-8b-h100 [--serverless NAME]
        [--gpu-hour-usd X] [--rates 0.5 1 2 4 8] [--slice code conv] [--minutes 20] [--plot PNG]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.progress import Progress

from bench.plan_vs_replay import SLICES, TRACES
from router.economics.cost import break_even_utilization, token_cost_usd
from tidegate.offline.calibration import DEDICATED, PARTNERS, SERVERLESS
from tidegate.offline.planner.plans import Plan, System
from tidegate.offline.planner.sweep import sweep
from tidegate.offline.replay import Arrival, load, scale_rate, window

TARGET = 0.95
SLO_TTFT_MS = 2000.0
KINDS = ("all-serverless", "all-dedicated", "hybrid")


def kind(result: dict[str, Any]) -> str:
    if result["settings"]["replicas"] == 0:
        return "all-serverless"
    return "all-dedicated" if result["spill_share"] < 0.01 else "hybrid"


def best_of_each_kind(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """The cheapest plan per SLO-successful task of each kind among those meeting the target."""
    found: dict[str, dict[str, Any] | None] = dict.fromkeys(KINDS)
    for r in results:
        if (r["slo_attainment"] or 0) < TARGET or r["cost_per_slo_success_usd"] is None:
            continue
        best = found[kind(r)]
        if best is None or r["cost_per_slo_success_usd"] < best["cost_per_slo_success_usd"]:
            found[kind(r)] = r
    return found


KEEP_WARM_S = 30.0  # under the calibrations' 60 s scale-to-zero


PREDICTED_BUDGET_MS = 1500.0  # predicted-TTFT admission's budget, 3/4 of the SLO


def plans_for(load_replicas: float, max_num_seqs: int) -> list[Plan]:
    """All-serverless and pools around the load (fixed slots, or predicted-TTFT admission up to
    the engine's own `max_num_seqs`), each with and without a kept-warm serverless route (a
    burst after an idle gap otherwise waits out a cold load)."""
    counts = sorted({max(1, math.ceil(load_replicas * f)) for f in (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)} | {1})
    pools = [Plan(r, c, q) for r in counts for c in (16, 32, 64) for q in (0.0, 1000.0)]
    pools += [Plan(r, max_num_seqs, ttft_budget_ms=PREDICTED_BUDGET_MS) for r in counts]
    return [Plan(0, keep_warm_s=w) for w in (0.0, KEEP_WARM_S)] + [
        dataclasses.replace(p, keep_warm_s=w) for w in (0.0, KEEP_WARM_S) for p in pools
    ]


def replicas_of_load(rows: Sequence[Arrival], span_s: float, system: System) -> float:
    """The mean load in full replicas: the arrival rate over what a replica completes of tasks
    this size, prefill and decode sharing its steps (the engine's `tasks_per_hour`)."""
    if not rows:
        return 0.0
    mean_in = statistics.fmean(a.input_tokens for a in rows)
    mean_out = statistics.fmean(a.output_tokens for a in rows)
    per_replica_s = system.dedicated.tasks_per_hour(mean_in, mean_out) / 3600.0
    return len(rows) / span_s / per_replica_s


def sweep_slice(
    base: list[Arrival],
    rates: Sequence[float],
    minutes: float,
    system: System,
    progress: Progress,
    jobs: int,
) -> list[dict[str, Any]]:
    """Per rate: the volume, the load in replicas and the best plan of each kind."""
    rows_out = []
    bar = progress.add_task("rates", total=len(rates))
    for rate in rates:
        rows = scale_rate(base, rate, seed=1)
        span_s = minutes * 60
        load_replicas = replicas_of_load(rows, span_s, system)
        plans = plans_for(load_replicas, system.dedicated.max_num_seqs)
        plans_bar = progress.add_task(f"x{rate:g}: plans", total=len(plans))
        results = sweep(
            rows,
            plans,
            system,
            slo_ttft_ms=SLO_TTFT_MS,
            span_s=span_s,
            jobs=jobs,
            progress=functools.partial(progress.advance, plans_bar),
        )
        progress.remove_task(plans_bar)
        tokens = sum(a.input_tokens + a.output_tokens for a in rows)
        rows_out.append(
            {
                "rate": rate,
                "requests_per_day": len(rows) / minutes * 1440,
                "tokens_per_day": tokens / minutes * 1440,
                "load_replicas": load_replicas,
                "best": best_of_each_kind(results),
            }
        )
        progress.advance(bar)
    return rows_out


def _cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "none meets the SLO"
    return (
        f"{result['cost_per_slo_success_usd'] * 1000:.4f} ({result['plan']}, {result['slo_attainment']:.1%})"
    )


def table(name: str, found: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"\n{name}:",
        "| rate x | tokens/day | load (replicas) | all-serverless m$/task | all-dedicated | hybrid "
        "| chosen ÷ cheaper pure |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in found:
        best = row["best"]
        costs = {k: v["cost_per_slo_success_usd"] for k, v in best.items() if v is not None}
        pure = [costs[k] for k in ("all-serverless", "all-dedicated") if k in costs]
        ratio = f"{min(costs.values()) / min(pure):.2f}" if pure and costs else "-"
        lines.append(
            f"| {row['rate']:g} | {row['tokens_per_day'] / 1e6:,.0f} M | {row['load_replicas']:.2f} | "
            f"{_cell(best['all-serverless'])} | {_cell(best['all-dedicated'])} | {_cell(best['hybrid'])} "
            f"| {ratio} |"
        )
    return lines


def plot(
    path: Path, title: str, by_slice: dict[str, list[dict[str, Any]]], thresholds: dict[str, float]
) -> None:
    import matplotlib  # noqa: PLC0415 (the `report` extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import NullFormatter  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(by_slice), figsize=(6 * len(by_slice), 4.5), squeeze=False)
    for ax, (name, found) in zip(axes[0], by_slice.items(), strict=True):
        for k, style in zip(KINDS, ("s--", "^:", "o-"), strict=True):
            points = [(r["tokens_per_day"] / 1e6, r["best"][k]) for r in found if r["best"][k] is not None]
            ax.plot(
                [x for x, _ in points],
                [b["cost_per_slo_success_usd"] * 1000 for _, b in points],
                style,
                label=k,
            )
        ax.set_xscale("log")
        volumes = [r["tokens_per_day"] / 1e6 for r in found]
        ax.set_xticks(volumes, [f"{v:,.0f}" for v in volumes], fontsize=8)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("volume (million tokens per day)")
        ax.set_ylabel("m$ per SLO-successful task")
        ax.set_title(f"{name} (break-even utilization {thresholds[name]:.0%})", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calibration", choices=sorted(DEDICATED), default="llama-8b-h100")
    parser.add_argument("--serverless", choices=sorted(SERVERLESS), help="default: the calibration's partner")
    parser.add_argument("--gpu-hour-usd", type=float, help="default: the calibration's ($4.41)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 1, 2, 4, 8])
    parser.add_argument("--slice", nargs="+", choices=sorted(SLICES), default=sorted(SLICES))
    parser.add_argument("--minutes", type=float, default=20.0, help="trace minutes per slice")
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--plot", type=Path, help="write the crossover plot here (needs matplotlib)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    d = DEDICATED[args.calibration]
    if args.gpu_hour_usd is not None:
        d = dataclasses.replace(d, gpu_hour_usd=args.gpu_hour_usd)
    serverless_name = args.serverless or PARTNERS[args.calibration][0]
    s = SERVERLESS[serverless_name]
    system = System(d, s)
    started = time.perf_counter()
    lines: list[str] = []
    by_slice: dict[str, list[dict[str, Any]]] = {}
    thresholds: dict[str, float] = {}
    for name in args.slice:
        file, start = SLICES[name]
        base = window(load(args.traces / file), start, args.minutes)
        mean_in = statistics.fmean(a.input_tokens for a in base)
        mean_out = statistics.fmean(a.output_tokens for a in base)
        task_usd = token_cost_usd(mean_in, mean_out, s.usd_per_mtok_in, s.usd_per_mtok_out)
        capacity = d.tasks_per_hour(mean_in, mean_out)
        thresholds[name] = break_even_utilization(d.usd_per_hour, capacity, task_usd) or math.inf
        lines.append(
            f"\n{name}: mean prompt {mean_in:,.0f} tokens, answer {mean_out:,.0f}; one replica takes "
            f"{capacity:,.0f} such tasks an hour; a serverless task costs ${task_usd:.6f}; "
            f"break-even utilization {thresholds[name]:.0%}"
        )
        with Progress(transient=True) as progress:
            by_slice[name] = sweep_slice(base, args.rates, args.minutes, system, progress, args.jobs)
        lines += table(name, by_slice[name])
    title = f"{args.calibration} at ${d.gpu_hour_usd:g}/GPU-h against {serverless_name}"
    print(f"python -m bench.rate_sweep: {title} (SLO: TTFT <= 2 s for {TARGET:.0%} of requests)")
    print("\n".join(lines))
    if args.plot is not None:
        plot(args.plot, title, by_slice, thresholds)
        print(f"\nplot: {args.plot}")
    print(f"\nmodelled in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
