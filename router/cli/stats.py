"""`tidegate stats`: the routes report (`GET /admin/routes`) as terminal tables (rich)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table

from router.cli.admin_client import call_admin
from router.cli.watch import add_admin_options, show

_VERDICT_STYLE = {
    "solid": "green",
    "variable": "yellow",
    "cold starts": "red",
    "not production-ready": "bold red",
}


def render(report: dict[str, Any]) -> Group:
    """One table per model: a row per route, then the model's spill rates and outcomes."""
    tables = []
    for name, model in report["models"].items():
        table = Table(title=_title(name, model, report["window_s"]), title_justify="left", expand=False)
        for column in ("route", "kind", "req", "ok %", "TTFT p50", "p95", "p99", "CV %", "verdict"):
            table.add_column(column, justify="left" if column in ("route", "kind", "verdict") else "right")
        for column in ("ITL p50", "e2e p95", "in flight", "queue", "util %", "tokens in/out"):
            table.add_column(column, justify="right")
        for route, r in model["routes"].items():
            table.add_row(*_row(route, r))
        tables.append(table)
    return Group(*tables)


def _title(name: str, model: dict[str, Any], window_s: float) -> str:
    spills = ", ".join(f"{k} {v:.0%}" for k, v in model["spill_rate"].items()) or "none"
    outcomes = ", ".join(f"{k} {v}" for k, v in model["retry_outcomes"].items()) or "none"
    return (
        f"{name} — last {window_s:g}s: {model['requests']} requests; spills: {spills}; outcomes: {outcomes}"
    )


def _row(route: str, r: dict[str, Any]) -> list[str]:
    ttft = r["ttft_ms"] or {}
    verdict = ttft.get("verdict", "")
    style = _VERDICT_STYLE.get(verdict, "")
    return [
        route,
        r["kind"],
        str(r["requests"]),
        _pct(r["success_rate"]),
        _ms(ttft.get("p50")),
        _ms(ttft.get("p95")),
        _ms(ttft.get("p99")),
        f"{ttft['cv_percent']:.0f}" if ttft else "-",
        (f"[{style}]{escape(verdict)}[/]" if style else escape(verdict) if verdict else "-")
        + _probe_flag(r)
        + _parity_flag(r),
        _ms(r["itl_p50_ms"]),
        _ms(r["e2e_p95_ms"]),
        str(r.get("in_flight", "-")),
        str(r.get("queue_depth", "-")),
        _pct(r.get("utilization")),
        f"{r['tokens_in']}/{r['tokens_out']}",
    ]


def _probe_flag(route: dict[str, Any]) -> str:
    """A route an applied probe judged not production-ready (CV over 300%)."""
    probe = route.get("probe") or {}
    return f" [bold red](probe: CV {probe['cv_percent']:.0f}%)[/]" if probe.get("flagged") else ""


def _parity_flag(route: dict[str, Any]) -> str:
    """A route the last applied parity run found diverging: out of the spill order when enforced."""
    parity = route.get("parity") or {}
    if parity.get("verdict") != "diverges":
        return ""
    return (
        " [bold red](parity_diverges: out of the spill order)[/]"
        if parity.get("excluded")
        else (" [yellow](parity: diverges, not enforced)[/]")
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}"


def add_parser(commands: Any) -> None:
    stats = commands.add_parser(
        "stats", help="per-route figures over a window, as tables (GET /admin/routes)"
    )
    stats.add_argument("--window", default="5m", help="e.g. 30s, 5m, 1h (default 5m)")
    stats.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    stats.add_argument("--every", type=float, default=2.0, help="seconds between refreshes with --watch")
    add_admin_options(stats)
    stats.set_defaults(run=_stats)


def _stats(args: argparse.Namespace) -> int:
    """Print the routes report once, or refresh it every `--every` seconds with `--watch`."""
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the tables into 80 columns
        console = Console(width=220)

    def fetch() -> Group:
        return render(call_admin("GET", args.url, f"/admin/routes?window={args.window}", args.admin_key))

    return show(fetch, console, watch=args.watch, every_s=args.every)
