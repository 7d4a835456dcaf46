"""The economics report behind `GET /admin/report` and `tidegate report`: the routes report
(with each model's costs, what-ifs and recommendation, router/economics/costs.py), each model's traffic
shape (router/economics/shape.py), and the per-slice series and TTFT distributions the plots draw.

It reads only the store's merged windows (a fixed number of slices per route, whatever the
traffic), never the request path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from policies.types import Snapshot, route_key
from router.config import DedicatedEndpoint, GatewayConfig, ModelConfig
from router.economics.costs import slots_per_replica
from router.economics.routes_report import (
    LATENCIES,
    CountsAndLatency,
    WindowFigures,
    Windows,
    build_routes_report,
    report_routes,
)
from router.economics.schedule import recommended_schedule
from router.economics.shape import Series, merged_series, traffic_shape
from router.state.latency import MAPPING, Counts, Histogram, Metric, add_counts

_SERIES_FIELDS = ("requests", "errors", "busy_ms", "cost_usd", "tasks", "tasks_ok", "tokens_in", "tokens_out")


class _AllWindows(CountsAndLatency, Protocol):
    async def counts_series(
        self, routes: Sequence[str], window_s: float
    ) -> tuple[int, dict[str, list[tuple[int, Counts]]]]: ...


class SeriesWindows(Windows, Protocol):
    @property
    def series(self) -> _AllWindows: ...


async def economics_report(
    config: GatewayConfig, store: SeriesWindows, snapshot: Snapshot, window_s: float, model: str | None = None
) -> dict[str, Any]:
    """Each figure is read from the store once: the counter series feeds both the routes report
    (summed) and the plots; the TTFT and token histograms both the report and the shape."""
    step, series = await store.series.counts_series(report_routes(config), window_s)
    metrics = (*LATENCIES, Metric.TOKENS_IN, Metric.TOKENS_OUT)
    histograms = {m: await store.series.latency_window(config.route_keys(), m, window_s) for m in metrics}
    figures = WindowFigures(histograms, {route: _summed(rows) for route, rows in series.items()})
    report = build_routes_report(config, figures, snapshot, window_s, store.name, started_at=store.started_at)
    names = [model] if model else list(config.models)
    report["models"] = {name: report["models"][name] for name in names}
    routes = [route_key(name, e.name) for name in names for e in config.models[name].endpoints]
    for name in names:
        merged = merged_series([series[route_key(name, e.name)] for e in config.models[name].endpoints])
        capacity = sum(d.max_concurrency for d in config.models[name].dedicated)
        shape = traffic_shape(merged, step, capacity)
        _schedule(config.models[name], report["models"][name]["economics"], merged)
        shape["token_distribution"] = {
            side: _distribution(
                histograms[metric], [route_key(name, e.name) for e in config.models[name].endpoints]
            )
            for side, metric in (("input", Metric.TOKENS_IN), ("output", Metric.TOKENS_OUT))
        }
        report["models"][name]["traffic_shape"] = shape
    series = {route: series[route] for route in routes}
    report["series"] = {
        "slice_s": step,
        "routes": {
            route: [
                [start, {k: round(v, 6) for k, v in counts.items() if k in _SERIES_FIELDS}]
                for start, counts in rows
            ]
            for route, rows in series.items()
        },
    }
    report["ttft_distribution_ms"] = {
        route: sorted(
            [round(MAPPING.value(key), 3), count]
            for key, count in histograms[Metric.TTFT][route].counts.items()
        )
        for route in routes
    }
    report["endpoints"] = {
        route_key(name, e.name): _endpoint_facts(e) for name in names for e in config.models[name].endpoints
    }
    return report


def _summed(rows: list[tuple[int, Counts]]) -> Counts:
    total: Counts = {}
    for _, counts in rows:
        add_counts(total, counts)
    return total


def _distribution(histograms: dict[str, Histogram], routes: list[str]) -> dict[str, Any] | None:
    """Tokens per served answer over the model's routes: p50, p95, p99, mean (1% sketch)."""
    merged = Histogram()
    for route in routes:
        merged.merge(histograms.get(route, Histogram()))
    figures = merged.figures()
    if figures is None:
        return None
    return {
        "answers": figures.samples,
        "p50": round(figures.p50),
        "p95": round(figures.p95),
        "p99": round(figures.p99),
        "mean": round(figures.mean, 1),
    }


def _endpoint_facts(endpoint: Any) -> dict[str, Any]:
    if isinstance(endpoint, DedicatedEndpoint):
        return {
            "kind": "dedicated",
            "max_concurrency": endpoint.max_concurrency,
            "usd_per_hour": endpoint.usd_per_hour,
        }
    return {
        "kind": "serverless",
        "usd_per_mtok_in": endpoint.usd_per_mtok_in,
        "usd_per_mtok_out": endpoint.usd_per_mtok_out,
    }


def _schedule(model: ModelConfig, economics: dict[str, Any], merged: Series) -> None:
    """The break-even schedule for the model's first dedicated endpoint, from every route's
    busy time per slice (what could have run there), into the economics and its advice."""
    if not model.dedicated:
        return
    busy = [(start, counts.get("busy_ms", 0.0) / 1000) for start, counts in merged]
    found = recommended_schedule(
        model.dedicated[0].name,
        slots_per_replica(model.dedicated[0]),
        economics["what_if"].get("break_even_utilization"),
        busy,
    )
    if found is not None:
        economics["schedule"], line = found
        economics["recommendation"].append(line)
