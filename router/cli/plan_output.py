"""What `tidegate plan` shows: the table of plans and the Pareto plot."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from rich.table import Table

Z95 = 1.6449  # the standard normal's 95th percentile: a log-normal's p95 / p50 = exp(Z95 x sigma)


def _usd(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def plan_table(
    results: list[dict[str, Any]], verdict: dict[str, Any], front: list[str], args: argparse.Namespace
) -> Table:
    table = Table(title=f"plans: SLO TTFT <= {args.slo_ttft_ms:g} ms for {args.target:.0%} of requests")
    for column in ("plan", "cost", "per SLO success", "SLO met", "TTFT p95 ms", "ded. util", "spill"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    if args.price_sweep:
        table.add_column("wins below $/GPU-h", justify="right")
        table.add_column("or serverless price x", justify="right")
    ordered = sorted(results, key=lambda r: r.get("cost_per_slo_success_usd") or math.inf)
    shown = ordered if args.show_all else ordered[: args.top]
    for r in shown:
        marks = ("* " if r["plan"] == verdict["chosen"] else "") + ("(pareto) " if r["plan"] in front else "")
        util = r.get("dedicated_utilization")
        row = [
            marks + r["plan"],
            _usd(r["cost_usd"]),
            _usd(r.get("cost_per_slo_success_usd"), 5),
            f"{r['slo_attainment']:.1%}",
            f"{r['ttft_ms']['p95']:,.0f}",
            "-" if util is None else f"{util:.0%}",
            f"{r['spill_share']:.0%}",
        ]
        if args.price_sweep:
            be = r.get("break_even") or {}
            row.append(_usd(be.get("gpu_hour_usd")))
            row.append("-" if be.get("serverless_price_x") is None else f"{be['serverless_price_x']:.2f}x")
        table.add_row(*row)
    if len(shown) < len(results):
        table.caption = (
            f"the {len(shown)} cheapest of {len(results)} plans per SLO success (--show-all for all)"
        )
    return table


def pareto_plot(found: dict[str, Any], path: Path) -> str:
    try:
        import matplotlib  # noqa: PLC0415 (optional: the `report` extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "no pareto.png: the plot needs matplotlib (pip install 'tidegate[report]')"
    plans = [p for p in found["plans"] if p.get("cost_per_slo_success_usd") is not None]
    front = set(found["pareto"])
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter(
        [p["cost_per_slo_success_usd"] * 1000 for p in plans],
        [p["slo_attainment"] * 100 for p in plans],
        color="#bbbbbb",
        s=14,
        label="plan",
    )
    edge = sorted((p for p in plans if p["plan"] in front), key=lambda p: p["cost_per_slo_success_usd"])
    ax.plot(
        [p["cost_per_slo_success_usd"] * 1000 for p in edge],
        [p["slo_attainment"] * 100 for p in edge],
        marker="o",
        color="#1f77b4",
        label="Pareto front",
    )
    for p in edge:
        ax.annotate(p["plan"], (p["cost_per_slo_success_usd"] * 1000, p["slo_attainment"] * 100), fontsize=7)
    chosen = next((p for p in plans if p["plan"] == found.get("chosen")), None)
    if chosen is not None:
        ax.scatter(
            [chosen["cost_per_slo_success_usd"] * 1000],
            [chosen["slo_attainment"] * 100],
            marker="*",
            s=220,
            color="#d62728",
            label="chosen",
            zorder=3,
        )
    ax.axhline(found["slo"]["target_attainment"] * 100, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    plain = matplotlib.ticker.FormatStrFormatter("%g")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set_xlabel("cost per SLO-successful task (USD per 1,000 tasks)")
    ax.set_ylabel(f"SLO attainment (% of requests, TTFT <= {found['slo']['ttft_ms']:g} ms)")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Pareto plot: {path}"
