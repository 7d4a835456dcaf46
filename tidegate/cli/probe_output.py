"""What `tidegate probe` shows and writes: its table, plots, HTML page, the comparison of two
runs and the hour-of-day table of repeated runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
from rich.table import Table

from tidegate.offline.probe import ProbeResult, by_hour


def table(report: dict[str, Any]) -> Table:
    t = Table(
        title=f"TTFT consistency (ms), {report['method']['requests']} requests per endpoint at concurrency 1"
    )
    for column in (
        "rank",
        "endpoint",
        "n",
        "errors",
        "median",
        "p95",
        "p99",
        "mean",
        "std",
        "CV %",
        "verdict",
        "ITL p50",
        "e2e p95",
    ):
        t.add_column(column, justify="left" if column in ("endpoint", "verdict") else "right")
    by_name = {s["endpoint"]: s for s in report["endpoints"]}
    for entry in report["ranking"]:
        s = by_name[entry["endpoint"]]
        ttft = s.get("ttft_ms") or {}
        t.add_row(
            str(entry["rank"]),
            s["endpoint"],
            str(s["n"]),
            str(s["errors"]),
            *(_ms(ttft.get(k)) for k in ("median", "p95", "p99", "mean", "std")),
            f"{s['cv_percent']:.0f}" if s.get("cv_percent") is not None else "-",
            s["verdict"],
            _ms(s.get("itl_p50_ms")),
            _ms(s.get("e2e_p95_ms")),
        )
    return t


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def plots(results: dict[str, list[ProbeResult]], out: Path) -> dict[str, bytes]:
    """Per endpoint: the TTFT distribution (log x) and TTFT over time, outliers (over 3x the
    median) marked. Skipped, with a note, when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: PLC0415 (optional: the `report` extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("plots skipped: pip install 'tidegate[report]' for matplotlib", file=sys.stderr)
        return {}
    figures = {}
    for name, rs in results.items():
        ok = [r for r in rs if r.ok and not r.warmup and r.ttft_ms is not None]
        if not ok:
            continue
        values = [r.ttft_ms for r in ok if r.ttft_ms is not None]
        median = sorted(values)[len(values) // 2]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.5))
        low, high = max(min(values), 0.1), max(values)
        edges = [low * (high / low) ** (i / 40) for i in range(41)] if high > low else [low * 0.9, high * 1.1]
        left.hist(values, bins=edges)
        left.set_xscale("log")
        left.set(title=f"{name}: TTFT distribution", xlabel="TTFT (ms, log)", ylabel="requests")
        times = [r.at - ok[0].at for r in ok]
        cold = [i for i, v in enumerate(values) if v > 3 * median]
        right.plot(times, values, ".", label="TTFT")
        if cold:
            right.plot([times[i] for i in cold], [values[i] for i in cold], "rx", label="> 3x median (cold?)")
            right.legend(fontsize=8)
        right.set_yscale("log")
        right.set(title=f"{name}: TTFT over time", xlabel="seconds since the first", ylabel="TTFT (ms, log)")
        fig.tight_layout()
        path = out / f"ttft-{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        figures[name] = path.read_bytes()
    return figures


def write_html(report: dict[str, Any], figures: dict[str, bytes], path: Path) -> None:
    import base64  # noqa: PLC0415
    import html  # noqa: PLC0415

    rows = "".join(
        f"<tr><td>{e['rank']}</td><td>{html.escape(e['endpoint'])}</td><td>{e['p95_ms']}</td>"
        f"<td>{e['cv_percent']}</td><td>{html.escape(e['verdict'])}</td>"
        f"<td>{html.escape(e['caution'] or '')}</td></tr>"
        for e in report["ranking"]
    )
    images = "".join(
        f'<h3>{html.escape(n)}</h3><img alt="{html.escape(n)}" '
        f'src="data:image/png;base64,{base64.b64encode(p).decode()}">'
        for n, p in figures.items()
    )
    details = html.escape(orjson.dumps(report["endpoints"], option=orjson.OPT_INDENT_2).decode())
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>tidegate probe</title></head><body>"
        f"<h1>TTFT consistency probe, {html.escape(report['at'])}</h1>"
        "<table><tr><th>rank</th><th>endpoint</th>"
        f"<th>p95 ms</th><th>CV %</th><th>verdict</th><th>caution</th></tr>{rows}</table>{images}"
        f"<pre>{details}</pre></body></html>",
        encoding="utf-8",
    )


def compare(first: Path, second: Path) -> Table:
    """Two probe runs side by side, endpoint by endpoint."""
    a, b = (orjson.loads((d / "probe.json").read_bytes()) for d in (first, second))
    t = Table(title=f"{first} ({a['at']}) vs {second} ({b['at']})")
    for column in (
        "endpoint",
        "p50 A",
        "p50 B",
        "p95 A",
        "p95 B",
        "CV% A",
        "CV% B",
        "verdict A",
        "verdict B",
    ):
        t.add_column(column)
    left = {s["endpoint"]: s for s in a["endpoints"]}
    right = {s["endpoint"]: s for s in b["endpoints"]}
    for name in sorted(set(left) | set(right)):
        x, y = left.get(name, {}), right.get(name, {})
        t.add_row(
            name,
            _ms((x.get("ttft_ms") or {}).get("median")),
            _ms((y.get("ttft_ms") or {}).get("median")),
            _ms((x.get("ttft_ms") or {}).get("p95")),
            _ms((y.get("ttft_ms") or {}).get("p95")),
            str(x.get("cv_percent", "-")),
            str(y.get("cv_percent", "-")),
            x.get("verdict", "-"),
            y.get("verdict", "-"),
        )
    return t


def hours_table(out: Path) -> Table | None:
    """Every scheduled run in `out` so far, per endpoint and UTC hour of day: n, median and p95
    TTFT side by side, so peak and off-peak can be read against each other. Also written as
    `out/by-hour.json`."""
    results: dict[str, list[ProbeResult]] = {}
    for lines in sorted(out.glob("run-*/requests.jsonl")):
        for line in lines.read_bytes().splitlines():
            found = orjson.loads(line)
            results.setdefault(found["endpoint"], []).append(ProbeResult(**found))
    if not results:
        return None
    hours = {name: by_hour(rs) for name, rs in results.items()}
    (out / "by-hour.json").write_bytes(orjson.dumps(hours, option=orjson.OPT_INDENT_2))
    t = Table(
        title=f"TTFT (ms) by UTC hour of day over {len(list(out.glob('run-*')))} run(s): n / median / p95"
    )
    t.add_column("hour")
    names = sorted(hours)
    for name in names:
        t.add_column(name, justify="right")
    for hour in sorted({h for per in hours.values() for h in per}):
        cells = []
        for name in names:
            cell = hours[name].get(hour)
            cells.append(f"{cell['n']} / {_ms(cell['median'])} / {_ms(cell['p95'])}" if cell else "-")
        t.add_row(hour, *cells)
    return t
