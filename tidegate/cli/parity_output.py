"""What `tidegate parity` shows and writes: its table, the HTML case matrix, and what changed
between two runs (a provider's silent model update shows up there)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import orjson
from rich.table import Table


def table(report: dict[str, Any]) -> Table:
    t = Table(
        title=f"parity of {report['model']} against {report['reference']}, "
        f"{report['method']['cases']} cases x {report['method']['repeat']}"
    )
    for column in (
        "endpoint",
        "pass",
        "95% interval",
        "agreement",
        "refusals",
        "errors",
        "tokens p50",
        "cost $",
        "verdict",
    ):
        t.add_column(column, justify="left" if column in ("endpoint", "verdict") else "right")
    for e in report["endpoints"]:
        low, high = e["pass_interval"]
        t.add_row(
            e["endpoint"],
            _percent(e["pass_rate"]),
            f"{low:.0%}-{high:.0%}",
            _percent(e["agreement"]),
            _percent(e["refusal_rate"]),
            str(e["errors"]),
            str((e["output_tokens"] or {}).get("p50", "-")),
            f"{e['cost_usd']:.4f}",
            e["verdict"],
        )
    return t


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def write_html(report: dict[str, Any], path: Path) -> None:
    """The endpoints' table and the per-case matrix: passed of repeats, and how it failed."""
    names = [e["endpoint"] for e in report["endpoints"]]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    for case, cells in report["cases"].items():
        tds = []
        for name in names:
            cell = cells.get(name)
            if cell is None:
                tds.append("<td></td>")
                continue
            bad = cell["passed"] < cell["repeats"] or cell["disagreed"]
            how = "<br>".join(html.escape(h) for h in cell["how"])
            tds.append(
                f"<td class='{'bad' if bad else 'ok'}'>{cell['passed']}/{cell['repeats']}"
                f"{'<br><small>' + how + '</small>' if how else ''}</td>"
            )
        rows.append(f"<tr><th>{html.escape(case)}</th>{''.join(tds)}</tr>")
    summary = "".join(
        f"<tr><td>{html.escape(e['endpoint'])}</td><td>{_percent(e['pass_rate'])}</td>"
        f"<td>{_percent(e['agreement'])}</td><td>{html.escape(e['verdict'])}</td>"
        f"<td>{html.escape(e['why'])}</td></tr>"
        for e in report["endpoints"]
    )
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>tidegate parity</title><style>"
        "td,th{border:1px solid #ccc;padding:4px}.bad{background:#fdd}.ok{background:#dfd}"
        "</style></head><body>"
        f"<h1>Parity of {html.escape(report['model'])}, {html.escape(report['at'])}</h1>"
        f"<p>reference: {html.escape(report['reference'])}; suite {html.escape(report['suite'])}</p>"
        "<table><tr><th>endpoint</th><th>pass</th><th>agreement</th><th>verdict</th><th>why</th></tr>"
        f"{summary}</table><h2>Cases</h2><table><tr><th>case</th>{head}</tr>{''.join(rows)}</table>"
        "</body></html>",
        encoding="utf-8",
    )


def compare(first: Path, second: Path) -> Table:
    """Two runs side by side: per endpoint its pass rate, agreement and verdict, and the cases
    it newly fails or no longer fails."""
    a, b = (orjson.loads((d / "parity.json").read_bytes()) for d in (first, second))
    t = Table(title=f"{first} ({a['at']}) vs {second} ({b['at']})")
    for column in (
        "endpoint",
        "pass A",
        "pass B",
        "agree A",
        "agree B",
        "verdict A",
        "verdict B",
        "newly failing",
        "fixed",
    ):
        t.add_column(column)
    left = {e["endpoint"]: e for e in a["endpoints"]}
    right = {e["endpoint"]: e for e in b["endpoints"]}
    for name in sorted(set(left) | set(right)):
        x, y = left.get(name, {}), right.get(name, {})
        before, after = set(x.get("failed_cases", ())), set(y.get("failed_cases", ()))
        t.add_row(
            name,
            _percent(x.get("pass_rate")),
            _percent(y.get("pass_rate")),
            _percent(x.get("agreement")),
            _percent(y.get("agreement")),
            x.get("verdict", "-"),
            y.get("verdict", "-"),
            ", ".join(sorted(after - before)) or "-",
            ", ".join(sorted(before - after)) or "-",
        )
    return t
