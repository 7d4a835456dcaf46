"""How `tidegate plan` models its plans: the discrete-event model over every request, or, for a
trace too long for that (a week at a busy rate), over a stratified sample of its slices
(tidegate/offline/planner/sampled.py), with the options that choose and shape the sample."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from router.cli.options import option
from tidegate.cli.progress import counting
from tidegate.offline.planner import sampled
from tidegate.offline.planner.plans import Plan, System
from tidegate.offline.planner.sweep import sweep
from tidegate.offline.replay import Arrival

OPTIONS = (
    option(
        "--sampling",
        choices=("auto", "on", "off"),
        default="auto",
        help=f"model a stratified sample of the trace's slices (auto: over {sampled.AUTO_ABOVE:,} requests)",
    ),
    option("--slice-s", type=float, default=sampled.SLICE_S, help="--sampling: a slice's length"),
    option(
        "--slices-per-stratum",
        type=int,
        default=sampled.PER_STRATUM,
        help="--sampling: slices modelled per stratum of like request counts",
    ),
)


def model(
    rows: Sequence[Arrival],
    plans: Sequence[Plan],
    system: System,
    args: argparse.Namespace,
    *,
    span_s: float,
    console: Console,
) -> list[dict[str, Any]]:
    """Every plan's figures, exact or estimated from the sample (each result then says so)."""
    if args.sampling == "off" or (args.sampling == "auto" and len(rows) <= sampled.AUTO_ABOVE):
        with counting(console, "modelling plans", len(plans)) as advance:
            slo, jobs = args.slo_ttft_ms, args.jobs
            return sweep(rows, plans, system, slo_ttft_ms=slo, span_s=span_s, progress=advance, jobs=jobs)
    with console.status(f"sampling {len(rows):,} requests in {args.slice_s:g}s slices"):
        sample = sampled.sample(rows, span_s, slice_s=args.slice_s, per_stratum=args.slices_per_stratum)
    shape = sample.describe()
    console.print(
        f"sampled: {shape['slices']} of {shape['of_slices']} slices with traffic ({shape['strata']} strata), "
        f"{shape['requests_modelled']:,} of {shape['of_requests']:,} requests modelled per plan "
        "(--sampling off: every request)"
    )
    with counting(console, "modelling plans on the sample", len(plans)) as advance:
        return sampled.sweep_sampled(
            sample, plans, system, slo_ttft_ms=args.slo_ttft_ms, progress=advance, jobs=args.jobs
        )
