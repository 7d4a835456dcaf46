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
    """Cost per SLO-successful task against attainment: every plan in grey, the Pareto front
    numbered, with a key beside the plot (the plan, its total cost and replicas), the chosen plan
    and the runner-up marked, and a tick at the chosen plan's cost."""
    try:
        import matplotlib  # noqa: PLC0415 (optional: the `report` extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "no pareto.png: the plot needs matplotlib (pip install 'tidegate[report]')"
    fig = pareto_figure(found)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Pareto plot: {path}"


def pareto_figure(found: dict[str, Any]) -> Any:
    """The plot `pareto_plot` saves (a matplotlib Figure; the caller closes it)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (optional: the `report` extra)
    from matplotlib.ticker import FormatStrFormatter, NullFormatter  # noqa: PLC0415

    plans = [p for p in found["plans"] if p.get("cost_per_slo_success_usd") is not None]
    by_label = {p["plan"]: p for p in plans}
    edge = sorted((by_label[n] for n in found["pareto"] if n in by_label), key=_x)
    fig, (ax, key) = plt.subplots(1, 2, figsize=(11, 5), gridspec_kw={"width_ratios": [3, 2]})
    ax.scatter([_x(p) for p in plans], [_y(p) for p in plans], color="#bbbbbb", s=14, label="plan")
    ax.plot([_x(p) for p in edge], [_y(p) for p in edge], marker="o", color="#1f77b4", label="Pareto front")
    for number, p in enumerate(edge, start=1):
        ax.annotate(str(number), (_x(p), _y(p)), xytext=(4, 4), textcoords="offset points", fontsize=8)
    runner = by_label.get(found.get("runner_up") or "")
    if runner is not None:  # hollow, under the chosen star: a plan at the same point never hides it
        ax.scatter([_x(runner)], [_y(runner)], marker="D", s=200, facecolors="none", edgecolors="#ff7f0e",
                   linewidths=1.5, label="runner-up", zorder=CHOSEN_ZORDER - 1)  # fmt: skip
    best = by_label.get(found.get("chosen") or "")
    if best is not None:
        ax.scatter([_x(best)], [_y(best)], marker="*", s=180, color="#d62728", edgecolors="black",
                   linewidths=0.6, label="chosen", zorder=CHOSEN_ZORDER)  # fmt: skip
        ax.annotate("chosen", (_x(best), _y(best)), xytext=(-14, -16), textcoords="offset points",
                    fontsize=8, color="#d62728", zorder=CHOSEN_ZORDER)  # fmt: skip
    ax.axhline(found["slo"]["target_attainment"] * 100, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    chosen = by_label.get(found.get("chosen") or "")
    runner_up = by_label.get(found.get("runner_up") or "")
    ends = (min(plans, key=_x), max(plans, key=_x)) if plans else ()
    ticks: list[float] = []
    for p in (chosen, *ends, runner_up):  # the chosen plan's first; none within 15% of another
        if p is not None and all(abs(_x(p) / t - 1) > 0.15 for t in ticks):
            ticks.append(float(f"{_x(p):.3g}"))
    ax.set_xticks(sorted(ticks))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("cost per SLO-successful task (USD per 1,000 tasks)")
    ax.set_ylabel(f"SLO attainment (% of requests, TTFT <= {found['slo']['ttft_ms']:g} ms)")
    ax.legend(loc="lower right", fontsize=8)
    key.axis("off")
    key.text(0, 1, _key(edge, found), va="top", family="monospace", fontsize=7, transform=key.transAxes)
    fig.tight_layout()
    return fig


CHOSEN_ZORDER = 10  # above every other mark of the plot


def _x(plan: dict[str, Any]) -> float:
    return float(plan["cost_per_slo_success_usd"]) * 1000


def _y(plan: dict[str, Any]) -> float:
    return float(plan["slo_attainment"]) * 100


def _key(edge: list[dict[str, Any]], found: dict[str, Any]) -> str:
    """The Pareto front's numbers, spelled out: plan, total cost, replicas."""
    marks = {found.get("chosen"): " (chosen)", found.get("runner_up"): " (runner-up)"}
    lines = ["Pareto front"]
    for number, p in enumerate(edge, start=1):
        lines.append(f"{number:>2}. {p['plan']}{marks.get(p['plan'], '')}")
        lines.append(f"    ${p['cost_usd']:,.2f} total, {p['settings']['replicas']} replicas")
    on_front = {p["plan"] for p in edge}
    for name in (found.get("chosen"), found.get("runner_up")):
        off: dict[str, Any] | None = next((q for q in found["plans"] if q["plan"] == name), None)
        if off is not None and name not in on_front:
            lines.append(f" -  {name}{marks[name]}, off the front")
            lines.append(f"    ${off['cost_usd']:,.2f} total, {off['settings']['replicas']} replicas")
    return "\n".join(lines)
