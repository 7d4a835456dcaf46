"""`tidegate stats`: the routes report (`GET /admin/routes`) as terminal tables (rich)."""

from __future__ import annotations

import argparse
from typing import Any

from rich import box
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


WIDE = 150  # columns from which every figure gets its own column (below: the compact table)
_SHORT_VERDICT = {"cold starts": "cold", "not production-ready": "not ready"}  # others: as they are


def _short_verdict(verdict: str) -> str:
    if verdict.startswith("too few samples"):
        return "few samples"
    return _SHORT_VERDICT.get(verdict, verdict)


def render(report: dict[str, Any], width: int = WIDE) -> Group:
    """One table per model: a row per route, under a title with the model's canary, spill
    rates and outcomes. Under `WIDE` columns the table is compact (units in the headers, short
    kinds and verdicts, no token totals), so it stays readable in a 100-column terminal."""
    tables = []
    wide = width >= WIDE
    for name, model in report["models"].items():
        table = Table(title=_title(name, model, report["window_s"]), title_justify="left", expand=False)
        if not wide:
            table.box, table.padding, table.pad_edge = box.SIMPLE_HEAD, (0, 1), False
            table.collapse_padding = True
            table.caption, table.caption_justify = _COMPACT_CAPTION, "left"
        for column in _WIDE_COLUMNS if wide else _COMPACT_COLUMNS:
            table.add_column(
                column, justify="left" if column in _LEFT else "right", no_wrap=column == "route"
            )
        for route, r in model["routes"].items():
            table.add_row(*(_row(route, r) if wide else _compact_row(route, r)))
        tables.append(table)
    return Group(*tables)


_WIDE_COLUMNS = (
    "route", "kind", "req", "ok %", "TTFT p50", "p95", "p99", "CV %", "verdict",
    "ITL p50", "e2e p95", "in flight", "waiting", "util %", "tokens in/out",
)  # fmt: skip
_COMPACT_COLUMNS = (
    "route", "kind", "req", "ok%", "p50", "p95", "p99", "CV%", "ITL",
    "busy", "wait", "util%", "verdict",
)  # fmt: skip
_COMPACT_CAPTION = "p50/p95/p99: TTFT in ms; ITL: p50 in ms; busy: in flight; wait: in line for a slot"
_LEFT = frozenset({"route", "kind", "verdict"})


def _title(name: str, model: dict[str, Any], window_s: float) -> str:
    spills = ", ".join(f"{k} {v:.0%}" for k, v in model["spill_rate"].items()) or "none"
    outcomes = ", ".join(f"{k} {v}" for k, v in model["retry_outcomes"].items()) or "none"
    canary = model.get("canary") or {}
    shown = ""
    if canary:
        shown = f"canary {canary['percent']:g}%"
        if canary["source"] == "live":
            shown += f" [bold yellow](live; the file says {canary['configured']:g}%: canary reset)[/]"
        shown += "; "
    return (
        f"{name} — last {window_s:g}s: {model['requests']} requests; {shown}spills: {spills}; "
        f"outcomes: {outcomes}"
    )


def _row(route: str, r: dict[str, Any]) -> list[str]:
    ttft = r["ttft_ms"] or {}
    return [
        route,
        r["kind"],
        str(r["requests"]),
        _pct(r["success_rate"]),
        _ms(ttft.get("p50")),
        _ms(ttft.get("p95")),
        _ms(ttft.get("p99")),
        f"{ttft['cv_percent']:.0f}" if ttft else "-",
        _verdict(r, ttft.get("verdict", "")),
        _ms(r["itl_p50_ms"]),
        _ms(r["e2e_p95_ms"]),
        str(r.get("in_flight", "-")),
        str(r.get("waiting", "-")),
        _pct(r.get("utilization")),
        f"{r['tokens_in']}/{r['tokens_out']}",
    ]


def _compact_row(route: str, r: dict[str, Any]) -> list[str]:
    ttft = r["ttft_ms"] or {}
    return [
        route,
        "ded" if r["kind"] == "dedicated" else "sl",
        str(r["requests"]),
        _pct(r["success_rate"], digits=0),
        _number(ttft.get("p50")),
        _number(ttft.get("p95")),
        _number(ttft.get("p99")),
        f"{ttft['cv_percent']:.0f}" if ttft else "-",
        _number(r["itl_p50_ms"]),
        str(r.get("in_flight", "-")),
        str(r.get("waiting", "-")),
        _pct(r.get("utilization"), digits=0),
        _verdict(
            r,
            _short_verdict(ttft.get("verdict", "")),
            long=ttft.get("verdict", ""),
        ),
    ]


def _verdict(r: dict[str, Any], shown: str, long: str | None = None) -> str:
    style = _VERDICT_STYLE.get(long if long is not None else shown, "")
    text = (f"[{style}]{escape(shown)}[/]" if style else escape(shown)) if shown else "-"
    return text + _probe_flag(r) + _parity_flag(r)


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


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}"


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

    def fetch() -> Group:  # the width read again each time: a resized terminal gets its layout
        report = call_admin("GET", args.url, f"/admin/routes?window={args.window}", args.admin_key)
        return render(report, console.width)

    return show(fetch, console, watch=args.watch, every_s=args.every)
