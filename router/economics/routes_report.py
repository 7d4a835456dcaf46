"""The routes report behind `GET /admin/routes` and `tidegate stats`: per model and route, what
happened over a window, from the histograms and counters every replica merged into the store.

Times are milliseconds; rates are fractions in [0, 1]; `cv_percent` is std / mean x 100 as the
field notes report it, with their verdict.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.base import Reason
from policies.types import Figures, Snapshot, route_key
from router.config import DedicatedEndpoint, Endpoint, GatewayConfig
from router.economics.costs import Span, model_costs, provisioned
from router.economics.teams import team_costs
from router.state.latency import Counts, Histogram, Metric, add_counts, resolution_for, window_start

_WINDOW = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
UNROUTED = "-"  # the counters of requests that never reached an endpoint
VERDICT_SAMPLES = 75  # the field notes' minimum before a CV verdict means anything


def parse_window(text: str) -> float:
    """`300`, `30s`, `5m`, `1h`, `1d` -> seconds; ValueError otherwise."""
    found = _WINDOW.fullmatch(text)
    if not found:
        raise ValueError(f"window {text!r} is not a duration like 30s, 5m or 1h")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def cv_verdict(cv_percent: float) -> str:
    """The field notes' reading of TTFT variability."""
    if cv_percent > 300:
        return "not production-ready"
    if cv_percent > 100:
        return "cold starts"
    if cv_percent >= 40:
        return "variable"
    return "solid"


def latency(histogram: Histogram) -> dict[str, Any] | None:
    return figures_json(histogram.figures())


def figures_json(figures: Figures | None) -> dict[str, Any] | None:
    """Latency figures for JSON: ms rounded to 0.01, CV% with its verdict."""
    if figures is None:
        return None
    cv_percent = figures.cv * 100
    verdict = cv_verdict(cv_percent)
    if figures.samples < VERDICT_SAMPLES:
        verdict = f"too few samples (< {VERDICT_SAMPLES})"
    return {
        "samples": figures.samples,
        "p50": round(figures.p50, 2),
        "p95": round(figures.p95, 2),
        "p99": round(figures.p99, 2),
        "mean": round(figures.mean, 2),
        "std": round(figures.cv * figures.mean, 2),
        "cv_percent": round(cv_percent, 1),
        "verdict": verdict,
    }


def _prefixed(counts: Counts, prefix: str) -> dict[str, int]:
    return {k.removeprefix(prefix): int(v) for k, v in sorted(counts.items()) if k.startswith(prefix)}


def _spanned_s(window_s: float, wall: float) -> float:
    """Seconds the window's whole slices cover up to now (the denominator of utilization)."""
    return max(wall - window_start(wall, window_s), 1e-9)


class CountsAndLatency(Protocol):
    async def latency_window(
        self, routes: Sequence[str], metric: Metric, window_s: float
    ) -> dict[str, Histogram]: ...

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]: ...


class Windows(Protocol):
    """The state store as reports read it: every replica's merged histograms and counters (its
    series role), and when the gateway started using it (`started_at`, Unix seconds)."""

    name: str
    started_at: float

    @property
    def series(self) -> CountsAndLatency: ...


LATENCIES = (Metric.TTFT, Metric.ITL, Metric.E2E, Metric.QUEUE)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """A window's merged figures, read once: histograms by metric and route, counters by route."""

    histograms: dict[Metric, dict[str, Histogram]]
    counts: dict[str, Counts]


def report_routes(config: GatewayConfig) -> list[str]:
    """The routes a report reads: every configured one, each model's unrouted counters and
    its shadow candidate's (an endpoint that takes no live traffic)."""
    candidates = [
        route_key(name, m.shadow.candidate.name)
        for name, m in config.models.items()
        if m.shadow is not None and m.shadow.candidate is not None
    ]
    return [*config.route_keys(), *(route_key(m, UNROUTED) for m in config.models), *candidates]


async def read_window(
    config: GatewayConfig, store: Windows, window_s: float, metrics: Sequence[Metric] = LATENCIES
) -> WindowFigures:
    routes = config.route_keys()
    histograms = {metric: await store.series.latency_window(routes, metric, window_s) for metric in metrics}
    return WindowFigures(histograms, await store.series.counts_window(report_routes(config), window_s))


async def routes_report(
    config: GatewayConfig, store: Windows, snapshot: Snapshot, window_s: float
) -> dict[str, Any]:
    """The report over the last `window_s` seconds; `snapshot` supplies the live in-flight."""
    figures = await read_window(config, store, window_s)
    return build_routes_report(config, figures, snapshot, window_s, store.name, started_at=store.started_at)


def build_routes_report(
    config: GatewayConfig,
    figures: WindowFigures,
    snapshot: Snapshot,
    window_s: float,
    store_name: str,
    *,
    started_at: float = 0.0,
) -> dict[str, Any]:
    """The report over the window, or since `started_at` when the gateway is younger than the
    window: a dedicated pool is billed (and its utilization counted) only while it existed."""
    counts = figures.counts
    wall = time.time()
    span = Span(max(wall - _spanned_s(window_s, wall), min(started_at, wall - 1e-9)), wall)
    models: dict[str, Any] = {}
    for name, model in config.models.items():
        per_route = {e.name: _route_entry(name, e, figures, snapshot, span) for e in model.endpoints}
        per_route_counts = [counts.get(route_key(name, e.name), {}) for e in model.endpoints]
        per_route_counts.append(counts.get(route_key(name, UNROUTED), {}))
        models[name] = _model_totals(per_route_counts) | {
            "canary": {  # live: a `canary set` or a run's, obeyed over the file's until `canary reset`
                "percent": snapshot.canary_percent.get(name, model.canary_percent),
                "configured": model.canary_percent,
                "source": "live" if name in snapshot.canary_percent else "file",
            },
            "routes": per_route,
            "economics": model_costs(name, model, counts, span)
            | {"teams": team_costs(name, model, counts, span)},
        }
        if model.shadow is not None:  # its own line, never in the route's figures or the blend
            target = model.shadow.target_name
            shadow = shadow_entry(counts.get(route_key(name, target), {}))
            models[name]["shadow"] = {
                "endpoint": target,
                "candidate": model.shadow.candidate is not None,
            } | shadow
            models[name]["economics"]["shadow_usd"] = shadow["cost_usd"]
    return {
        "window_s": window_s,
        "slice_s": resolution_for(window_s),
        "state_store": store_name,
        "models": models,
    }


def _route_entry(
    model: str, endpoint: Endpoint, figures: WindowFigures, snapshot: Snapshot, span: Span
) -> dict[str, Any]:
    key = route_key(model, endpoint.name)
    histograms, c = figures.histograms, figures.counts.get(key, {})
    requests = int(c.get("requests", 0))
    entry: dict[str, Any] = {
        "kind": endpoint.kind.value,
        "requests": requests,
        "success_rate": round(1 - c.get("errors", 0) / requests, 4) if requests else None,
        "ttft_ms": latency(histograms[Metric.TTFT][key]),
        "itl_p50_ms": _p(histograms[Metric.ITL][key], 0.5),
        "e2e_p95_ms": _p(histograms[Metric.E2E][key], 0.95),
        "queue_wait_p95_ms": _p(histograms[Metric.QUEUE][key], 0.95),
        "reasons": _prefixed(c, "reason:"),
        "outcomes": _prefixed(c, "outcome:"),
        "tokens_in": int(c.get("tokens_in", 0)),
        "tokens_out": int(c.get("tokens_out", 0)),
    }
    if isinstance(endpoint, DedicatedEndpoint):
        entry |= _pool_entry(endpoint, c, snapshot, span)
    if c.get("keep_warm"):
        entry["keep_warm"] = {"pings": int(c["keep_warm"]), "failed": int(c.get("keep_warm_failed", 0))}
    return entry


def _pool_entry(endpoint: DedicatedEndpoint, c: Counts, snapshot: Snapshot, span: Span) -> dict[str, Any]:
    """A dedicated pool's live state, utilization and, with predicted-TTFT admission, what it
    predicts from (its prefill model, the engine's own queue)."""
    capacity_s = provisioned(endpoint, span.start, span.end).capacity_s
    entry: dict[str, Any] = {
        "in_flight": snapshot.in_flight.get(endpoint.name, 0),
        "queue_depth": snapshot.queue_depth(endpoint.name),
        "waiting": snapshot.waiting.get(endpoint.name, 0),  # in line for a slot (queue_depth less in_flight)
        "utilization": round(c.get("busy_ms", 0.0) / 1000 / capacity_s, 4) if capacity_s > 0 else 0.0,
    }
    if c.get("batch"):  # batch keys' requests (router/request/priority.py): what they added
        interactive_ms = c.get("busy_ms", 0.0) - c.get("batch_busy_ms", 0.0)
        entry["utilization_without_batch"] = (
            round(interactive_ms / 1000 / capacity_s, 4) if capacity_s > 0 else 0.0
        )
        entry["batch"] = {
            "requests": int(c["batch"]),
            "avoided_serverless_usd": round(c.get("batch_avoided_usd", 0.0), 6),
        }
    prefill = snapshot.prefill.get(endpoint.name)
    if prefill is None:
        return entry
    entry["pending_prompt_tokens"] = snapshot.pending_prompt_tokens.get(endpoint.name, 0)
    entry["prefill_model"] = {
        "tokens_per_s": round(prefill.tokens_per_s, 1),
        "overhead_ms": round(prefill.overhead_ms, 1),
        "error_ms": round(prefill.error_ms, 1),
        "samples": prefill.samples,
    }
    queue = snapshot.engine_queue.get(endpoint.name)
    if queue is not None:  # the engine's own queue, every client's
        mean = None if queue.mean_prompt_tokens is None else round(queue.mean_prompt_tokens, 1)
        entry["engine_queue"] = {"waiting": round(queue.waiting, 1), "mean_prompt_tokens": mean}
    return entry


def _model_totals(route_counts: list[Counts]) -> dict[str, Any]:
    total: Counts = {}
    for counts in route_counts:
        add_counts(total, counts)
    requests = int(total.get("requests", 0))
    reasons = _prefixed(total, "reason:")
    spilled = {r: n for r, n in reasons.items() if Reason(r).is_spill}
    return {
        "requests": requests,
        "success_rate": round(1 - total.get("errors", 0) / requests, 4) if requests else None,
        "spill_rate": {r: round(n / requests, 4) for r, n in spilled.items()} if requests else {},
        "retry_outcomes": _prefixed(total, "outcome:"),
        "retries": int(total.get("retries", 0)),
    }


def _p(histogram: Histogram, q: float) -> float | None:
    figures = histogram.figures()
    if figures is None:
        return None
    value = {0.5: figures.p50, 0.95: figures.p95, 0.99: figures.p99}[q]
    return None if math.isnan(value) else round(value, 2)


def shadow_entry(c: Counts) -> dict[str, Any]:
    """What a model's shadow requests found over the window (router/spill/shadow.py)."""
    sent, compared = int(c.get("shadow", 0)), int(c.get("shadow_compared", 0))
    return {
        "sent": sent,
        "checks_pass_rate": round(c.get("shadow_ok", 0) / sent, 4) if sent else None,
        "failed": int(c.get("shadow_failed", 0)),
        "compared": compared,
        "agreement": round(c.get("shadow_agree", 0) / compared, 4) if compared else None,
        "cost_usd": round(c.get("shadow_usd", 0.0), 6),
    }
