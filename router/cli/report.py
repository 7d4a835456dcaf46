"""`tidegate report`: the economics report (`GET /admin/report`) as tables, JSON or a
self-contained HTML page with plots (matplotlib, PNGs embedded; `pip install 'tidegate[report]'`).

    tidegate report [--model M] [--window 24h] [--format table|json|html] [--out DIR]
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import math
import sys
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console, Group
from rich.table import Table

from router.cli.admin_client import AdminCallFailed, call_admin
from router.cli.watch import add_admin_options


def render_tables(report: dict[str, Any]) -> Group:
    """Per model: cost per route and blended, the what-ifs, the traffic shape, the advice."""
    parts: list[Any] = []
    for name, model in report["models"].items():
        economics = model["economics"]
        parts.append(_cost_table(name, model, report["window_s"]))
        w = economics["what_if"]
        parts.append(
            "what if: all-serverless "
            + _usd(w.get("all_serverless_usd"))
            + f" (at {w.get('all_serverless_priced_at', '-')}'s prices), all-dedicated "
            + _usd(w.get("all_dedicated_usd"))
            + f" ({w.get('all_dedicated_replicas', '-')} replica(s)); break-even utilization "
            + _pct(w.get("break_even_utilization"))
            + "%"
        )
        parts += _shape_lines(model.get("traffic_shape") or {})
        if economics.get("teams"):
            parts.append(_teams_table(name, economics["teams"]))
        parts += [f"[bold]→[/] {line}" for line in economics["recommendation"]]
        parts.append("")
    return Group(*parts)


def _cost_table(name: str, model: dict[str, Any], window_s: float) -> Table:
    economics = model["economics"]
    table = Table(title=f"{name}: cost over the last {window_s:g}s", title_justify="left")
    for column in ("route", "kind", "cost $", "tasks", "ok tasks", "$ / ok task", "wasted $", "util %"):
        table.add_column(column, justify="left" if column in ("route", "kind") else "right")
    rows = [*economics["routes"].values(), economics["blended"]]
    money = {key: usd_column([r[key] for r in rows]) for key in _MONEY}
    for i, (route, r) in enumerate(economics["routes"].items()):
        cells = _cost_cells(r, {key: shown[i] for key, shown in money.items()})
        table.add_row(route, model["routes"][route]["kind"], *cells, _pct(r.get("utilization")))
    blended = _cost_cells(economics["blended"], {key: shown[-1] for key, shown in money.items()})
    table.add_row("blended", "", *blended, "", style="bold")
    return table


_MONEY = ("cost_usd", "cost_per_successful_task_usd", "wasted_usd")


def _teams_table(name: str, teams: dict[str, Any]) -> Table:
    table = Table(title=f"{name}: by team (named keys)", title_justify="left")
    for column in ("team", "requests", "ok", "serverless $", "dedicated share $", "$ / ok request"):
        table.add_column(column, justify="left" if column == "team" else "right")
    keys = ("serverless_usd", "dedicated_share_usd", "cost_per_success_usd")
    money = [usd_column([t[key] for t in teams.values()]) for key in keys]
    for i, (team, t) in enumerate(teams.items()):
        table.add_row(team, str(t["requests"]), str(t["successes"]), *(column[i] for column in money))
    return table


def _cost_cells(r: dict[str, Any], money: dict[str, str]) -> list[str]:
    return [
        money["cost_usd"],
        str(r["tasks"]),
        str(r["successful_tasks"]),
        money["cost_per_successful_task_usd"],
        money["wasted_usd"],
    ]


def _shape_lines(shape: dict[str, Any]) -> list[str]:
    if not shape.get("slices"):
        return []
    lines = [
        f"traffic: {shape['requests']} requests, {shape['requests_per_minute']['median']}/min "
        f"median, {shape['requests_per_minute']['peak']}/min peak; concurrency mean "
        f"{shape['concurrency']['mean']}, busiest {shape['slice_s']}s slice "
        f"{shape['concurrency']['peak_slice_mean']} (dedicated capacity "
        f"{shape['dedicated_capacity']}); {shape['zero_traffic_percent']}% of slices idle; "
        f"{shape['bursts']['count']} burst(s)"
    ]
    tokens = shape.get("token_distribution") or {}
    if tokens.get("input") and tokens.get("output"):
        i, o = tokens["input"], tokens["output"]
        lines.append(
            f"tokens per answer: input p50 {i['p50']} / p95 {i['p95']}, "
            f"output p50 {o['p50']} / p95 {o['p95']}"
        )
    return lines


def usd_column(values: list[float | None]) -> list[str]:
    """A column of dollar figures at one precision: two decimals, or as many as its smallest
    non-zero figure needs for three significant digits (at most 6). The column reads `4.420`,
    `0.384`, `0.000`, never `4.42`, `0.384198`, `0.000000`."""
    small = min((abs(v) for v in values if v), default=1.0)
    decimals = 2 if small >= 1 else min(6, 2 - math.floor(math.log10(small)))
    return ["-" if v is None else f"{v:,.{decimals}f}" for v in values]


def _usd(value: float | None) -> str:
    return usd_column([value])[0]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}"


def plots(report: dict[str, Any]) -> dict[str, bytes]:
    """The report's figures as PNGs, by name. Needs matplotlib (the `report` extra)."""
    try:
        import matplotlib  # noqa: PLC0415 (optional: only the HTML report needs it)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise SystemExit(
            "tidegate report --format html needs matplotlib: pip install 'tidegate[report]'"
        ) from exc
    figures: dict[str, bytes] = {}
    for name, draw in (
        ("concurrency", _concurrency),
        ("cost", _cost),
        ("ttft", _ttft),
        ("utilization", _utilization),
    ):
        fig, ax = plt.subplots(figsize=(9, 3.5))
        draw(ax, report)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        buffer = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=100)
        plt.close(fig)
        figures[name] = buffer.getvalue()
    return figures


def _concurrency(ax: Any, report: dict[str, Any]) -> None:
    step, series, endpoints = report["series"]["slice_s"], report["series"]["routes"], report["endpoints"]
    for model in report["models"]:
        routes = [r for r in series if r.startswith(model + "/")]
        if not routes:
            continue
        times = [row[0] for row in series[routes[0]]]
        load = [
            sum(series[r][i][1].get("busy_ms", 0) for r in routes) / 1000 / step for i in range(len(times))
        ]
        ax.plot(_hours(times), load, label=f"{model}: mean in flight")
        dedicated = [e for r, e in endpoints.items() if r in routes and e["kind"] == "dedicated"]
        capacity = sum(e["max_concurrency"] for e in dedicated)
        if capacity:
            ax.axhline(capacity, linestyle="--", color="gray", label=f"{model}: dedicated capacity")
    ax.set(title="Concurrency over time", xlabel="hours ago", ylabel="requests in flight")


def _cost(ax: Any, report: dict[str, Any]) -> None:
    step, series, endpoints = report["series"]["slice_s"], report["series"]["routes"], report["endpoints"]
    for route, rows in series.items():
        facts = endpoints[route]
        if facts["kind"] == "dedicated":
            cost = [facts["usd_per_hour"] * step / 3600 for _ in rows]
        else:
            cost = [row[1].get("cost_usd", 0.0) for row in rows]
        ax.plot(_hours([row[0] for row in rows]), cost, label=route)
    ax.set(title=f"Cost per route per {step}s slice", xlabel="hours ago", ylabel="USD")


def _ttft(ax: Any, report: dict[str, Any]) -> None:
    every_value = [b[0] for bins in report["ttft_distribution_ms"].values() for b in bins]
    edges = _log_bins(every_value) if every_value else []
    for route, bins in report["ttft_distribution_ms"].items():
        if bins:
            values, weights = [b[0] for b in bins], [b[1] for b in bins]
            ax.hist(values, weights=weights, bins=edges, alpha=0.5, label=route)
    ax.set_xscale("log")
    ax.set(title="TTFT distribution per route", xlabel="TTFT (ms, log)", ylabel="requests")


def _utilization(ax: Any, report: dict[str, Any]) -> None:
    step, series, endpoints = report["series"]["slice_s"], report["series"]["routes"], report["endpoints"]
    for route, rows in series.items():
        facts = endpoints[route]
        if facts["kind"] == "dedicated":
            used = [row[1].get("busy_ms", 0) / 1000 / (facts["max_concurrency"] * step) * 100 for row in rows]
            ax.plot(_hours([row[0] for row in rows]), used, label=route)
    ax.set(title="Dedicated utilization", xlabel="hours ago", ylabel="% of slot-seconds busy", ylim=(0, 105))


def _hours(starts: list[int]) -> list[float]:
    last = starts[-1] if starts else 0
    return [(start - last) / 3600 for start in starts]


def _log_bins(values: list[float]) -> list[float]:
    low, high = max(min(values), 0.01), max(values)
    edges, edge = [], low / 1.05
    while edge <= high * 1.05:
        edges.append(edge)
        edge *= 1.1
    return [*edges, edge]


_CAPTIONS = {
    "concurrency": "Mean requests in flight per slice, all routes of the model, against the dedicated "
    "capacity (the sum of its dedicated endpoints' max_concurrency). Above the line: a burst that spills.",
    "cost": "What each route cost per slice: dedicated at its provisioned price (busy or idle), serverless "
    "at its tokens' prices.",
    "ttft": "Time to first token per route, from the merged histograms (1% relative accuracy). A second hump "
    "far to the right is the cold-start tail the field notes describe.",
    "utilization": "Busy slot-seconds / capacity per slice for each dedicated endpoint: what the paid "
    "GPUs did.",
}


def write_html(report: dict[str, Any], figures: dict[str, bytes]) -> str:
    """One self-contained page: the tables as HTML, the PNGs inline."""
    sections = []
    for name, model in report["models"].items():
        economics = model["economics"]
        rows = "".join(
            f"<tr><td>{html.escape(route)}</td><td>{_usd(r['cost_usd'])}</td><td>{r['tasks']}</td>"
            f"<td>{r['successful_tasks']}</td><td>{_usd(r['cost_per_successful_task_usd'])}</td>"
            f"<td>{_usd(r['wasted_usd'])}</td><td>{_pct(r.get('utilization'))}</td></tr>"
            for route, r in economics["routes"].items()
        )
        advice = "".join(f"<li>{html.escape(line)}</li>" for line in economics["recommendation"])
        what_if = html.escape(orjson.dumps(economics["what_if"]).decode())
        shape = html.escape(orjson.dumps(model.get("traffic_shape", {}), option=orjson.OPT_INDENT_2).decode())
        sections.append(
            f"<h2>{html.escape(name)}</h2><table><tr><th>route</th><th>cost $</th><th>tasks</th>"
            f"<th>ok tasks</th><th>$ / ok task</th><th>wasted $</th><th>util %</th></tr>{rows}</table>"
            f"<p><b>What if:</b> <code>{what_if}</code></p><ul>{advice}</ul>"
            f"<details><summary>traffic shape</summary><pre>{shape}</pre></details>"
        )
    images = "".join(
        f"<h3>{name}</h3><p>{html.escape(_CAPTIONS[name])}</p>"
        f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for name, png in figures.items()
    )
    style = "body{font-family:sans-serif;max-width:980px;margin:auto}td,th{padding:2px 8px;text-align:right}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>tidegate report</title>"
        f"<style>{style}</style></head><body><h1>tidegate report: last {report['window_s']:g}s</h1>"
        f"{''.join(sections)}{images}</body></html>"
    )


def write_out(report: dict[str, Any], out: Path, figures: dict[str, bytes]) -> list[Path]:
    """report.json, the PNGs and report.html into `out`; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json"]
    written[0].write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    for name, png in figures.items():
        path = out / f"{name}.png"
        path.write_bytes(png)
        written.append(path)
    if figures:
        page = out / "report.html"
        page.write_text(write_html(report, figures), encoding="utf-8")
        written.append(page)
    return written


def add_parser(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="cost per route and per successful task, what-ifs, advice and traffic shape (GET /admin/report)",
    )
    report.add_argument("--model", help="one model (default: all)")
    report.add_argument("--window", default="24h", help="e.g. 30m, 6h, 24h, 7d (default 24h)")
    report.add_argument("--format", choices=("table", "json", "html"), default="table")
    report.add_argument(
        "--out", type=Path, help="also write report.json (and with html: the PNGs and report.html)"
    )
    add_admin_options(report)
    report.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    query = f"/admin/report?window={args.window}" + (f"&model={args.model}" if args.model else "")
    try:
        with console.status(f"gathering the last {args.window} from {args.url} ..."):
            found = call_admin("GET", args.url, query, args.admin_key, timeout=60)
    except AdminCallFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    figures: dict[str, bytes] = {}
    if args.format == "html":
        with console.status("drawing the plots ..."):
            figures = plots(found)
    if args.out is not None:
        for path in write_out(found, args.out, figures):
            console.print(f"wrote {path}")
    if args.format == "json":
        sys.stdout.write(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.format == "html":
        if args.out is None:
            sys.stdout.write(write_html(found, figures))
    else:
        Console(width=None if sys.stdout.isatty() else 200).print(render_tables(found))
    return 0
