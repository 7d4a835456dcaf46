"""Telemetry: Prometheus metrics for `/metrics`, OpenTelemetry spans and metrics.

Metric and attribute names are constants here and nowhere else. Per process:
- Prometheus (prometheus-client, one registry per app): histograms of TTFT, ITL, e2e, queue
  wait and gateway overhead (seconds) by model, route and kind; counters of requests by
  outcome, spills by reason, retries by outcome; gauges of in-flight and queue depth per
  dedicated pool and of the state store's health, read from the snapshot at scrape time.
- OpenTelemetry (opentelemetry-sdk): a SERVER span per request, continuing the client's W3C
  `traceparent`, with a CLIENT child span per upstream attempt whose context is sent upstream;
  attributes follow the GenAI semantic conventions plus `tidegate.*`. The OTel histogram
  `gen_ai.server.time_to_first_token` (seconds). Spans and OTel metrics are exported over OTLP
  only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces/metrics variant) is set; otherwise
  no tracer provider is installed and requests create no spans at all.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from opentelemetry import trace
from opentelemetry.metrics import Histogram as OtelHistogram
from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Span, SpanKind, Tracer, TracerProvider
from prometheus_client import CollectorRegistry, Counter
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.core import Metric as PromMetric
from prometheus_client.registry import Collector

from policies.base import Reason
from policies.types import Snapshot
from router.config import Endpoint
from router.openai import PATHS
from router.record.records import RequestRecord

# GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/)
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
TTFT_METRIC = "gen_ai.server.time_to_first_token"
# ours
ROUTE = "tidegate.route"
KIND = "tidegate.kind"
REASON = "tidegate.reason"
OUTCOME = "tidegate.outcome"
ATTEMPT = "tidegate.attempt"

# Buckets for LLM latencies: 5 ms .. 2 min (TTFT, e2e) and 1 ms .. 2 s (ITL, overhead).
_LATENCY_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_SHORT_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2)
_ROUTE_LABELS = ("model", "route", "kind")


def otlp_configured(env: Mapping[str, str]) -> bool:
    return any(
        env.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    )


def default_providers(env: Mapping[str, str] | None = None) -> tuple[TracerProvider | None, MeterProvider]:
    """OTLP exporters when the standard variables ask for them; nothing otherwise."""
    env = os.environ if env is None else env
    if not otlp_configured(env):
        return None, NoOpMeterProvider()
    # The SDK and the exporters (with protobuf) cost a process ~0.3 s of CPU to import: only
    # a process that exports pays it.
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # noqa: PLC0415
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "tidegate")})
    tracer_provider = SdkTracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = SdkMeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
    )
    return tracer_provider, meter_provider


# attribute -> (Prometheus name, help, labels, buckets): the latency histograms
_HISTOGRAMS: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    "ttft": ("tidegate_ttft_seconds", "Request received to first token relayed", _ROUTE_LABELS, _LATENCY_S),
    "itl": ("tidegate_itl_seconds", "Mean inter-token latency of a stream", _ROUTE_LABELS, _SHORT_S),
    "e2e": ("tidegate_e2e_seconds", "Request received to last byte", _ROUTE_LABELS, _LATENCY_S),
    "queue": ("tidegate_queue_wait_seconds", "Wait in line for a dedicated slot", _ROUTE_LABELS, _LATENCY_S),
    "overhead": (
        "tidegate_overhead_seconds",
        "Time in the gateway itself before the answer started",
        ("model",),
        _SHORT_S,
    ),
}
# attribute -> (Prometheus name, help, labels): the counters
_COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "requests": ("tidegate_requests", "Requests by final route and outcome", (*_ROUTE_LABELS, "outcome")),
    "errors": (
        "tidegate_errors",
        "Requests that ended in an error the client read, by its OpenAI error code",
        (*_ROUTE_LABELS, "code"),
    ),
    "spills": ("tidegate_spills", "Requests not on their preferred target, by reason", ("model", "reason")),
    "retries": ("tidegate_retries", "Retry attempts, by the request's outcome", ("model", "outcome")),
    "hedges": (
        "tidegate_hedges",
        "Requests whose slow dedicated first token was hedged, by the kind that answered first",
        ("model", "winner"),
    ),
    "hedge_tokens": (
        "tidegate_hedge_duplicate_input_tokens",
        "Prompt tokens sent to a hedge race's loser for nothing (serverless: paid; dedicated: slot time)",
        ("model", "loser"),
    ),
    "cost": (
        "tidegate_cost_usd",
        "Token-priced spend (serverless answers at their endpoint's prices); dedicated capacity "
        "is paid by time: tidegate_dedicated_usd_per_hour",
        _ROUTE_LABELS,
    ),
    "tasks": (
        "tidegate_tasks",
        "Tasks settled by this process, on their route, by result (success or failure); "
        "feedback that failed a task later counts as result feedback_failed",
        ("model", "route", "result"),
    ),
}


_MAX_ROUTE_SERIES = 4096  # routes whose latency series a Telemetry keeps at hand
_MAX_CHILDREN = 4 * _MAX_ROUTE_SERIES  # label sets of the other request metrics kept at hand


@dataclass(frozen=True, slots=True)
class _RouteSeries:
    """One route's latency histograms, as `labels()` returns them."""

    ttft: PromHistogram
    itl: PromHistogram
    queue: PromHistogram
    e2e: PromHistogram


class Telemetry:
    """Everything the gateway reports about requests, built once per app (no globals)."""

    ttft: PromHistogram
    itl: PromHistogram
    e2e: PromHistogram
    queue: PromHistogram
    overhead: PromHistogram
    requests: Counter
    errors: Counter
    spills: Counter
    retries: Counter
    hedges: Counter
    hedge_tokens: Counter
    cost: Counter
    tasks: Counter

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.tracer: Tracer | None = tracer_provider.get_tracer("tidegate") if tracer_provider else None
        meter = (meter_provider or NoOpMeterProvider()).get_meter("tidegate")
        self._otel_ttft: OtelHistogram = meter.create_histogram(
            TTFT_METRIC, unit="s", description="Time to first token, as the client sees it"
        )
        for attr, (name, doc, labels, buckets) in _HISTOGRAMS.items():
            setattr(self, attr, PromHistogram(name, doc, labels, buckets=buckets, registry=self.registry))
        for attr, (name, doc, labels) in _COUNTERS.items():
            setattr(self, attr, Counter(name, doc, labels, registry=self.registry))
        self.economics: dict[str, dict[str, float]] = {}  # endpoint -> gauge -> value (EconomicsGauges)
        # (model, route, kind) -> its latency series, looked up once (`labels()` per request
        # was a measurable share of a request's CPU); bounded, past that looked up each time
        self._route_series: dict[tuple[str, str, str], _RouteSeries] = {}
        # (metric, label values) -> its child, for every other metric a request moves; bounded
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

    def watch(self, snapshot: Callable[[], Snapshot], store: StoreHealth) -> None:
        """Report the live gauges (in-flight, queue depth, store health, the dedicated pools'
        economics) at scrape time."""
        self.registry.register(_LiveGauges(snapshot, store, self.economics))

    def _series_of(self, labels: tuple[str, str, str]) -> _RouteSeries:
        found = self._route_series.get(labels)
        if found is None:
            found = _RouteSeries(
                self.ttft.labels(*labels),
                self.itl.labels(*labels),
                self.queue.labels(*labels),
                self.e2e.labels(*labels),
            )
            if len(self._route_series) < _MAX_ROUTE_SERIES:
                self._route_series[labels] = found
        return found

    def _child(self, metric: PromHistogram | Counter, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once per label set; past `_MAX_CHILDREN` sets,
        looked up each time."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = metric.labels(*labels)
            if len(self._children) < _MAX_CHILDREN:
                self._children[key] = found
        return found

    def task_settled(self, route: str, result: str) -> None:
        """A task settled (router/record/tasks.py), `route` as `model/endpoint`."""
        model, _, endpoint = route.partition("/")
        self.tasks.labels(model, endpoint, result).inc()

    def record(self, record: RequestRecord) -> None:
        route, kind = record.route or "-", str(record.kind or "-")
        labels = (record.model, route, kind)
        series = self._series_of(labels)
        m = record.measures
        if m.ttft_ms is not None:
            series.ttft.observe(m.ttft_ms / 1000)
            self._otel_ttft.record(m.ttft_ms / 1000, {GEN_AI_REQUEST_MODEL: record.model, ROUTE: route})
        if m.itl_ms is not None:
            series.itl.observe(m.itl_ms / 1000)
        if m.queue_ms > 0:
            series.queue.observe(m.queue_ms / 1000)
        if record.overhead_ms is not None:
            self._child(self.overhead, record.model).observe(record.overhead_ms / 1000)
        series.e2e.observe(record.e2e_ms / 1000)
        self._child(self.requests, *labels, record.outcome).inc()
        if m.code is not None:
            self._child(self.errors, *labels, m.code).inc()
        if record.cost_usd:
            self._child(self.cost, *labels).inc(record.cost_usd)
        if Reason(record.reason).is_spill:
            self._child(self.spills, record.model, record.reason).inc()
        retries = len(record.attempts) - 1 - (record.hedge is not None)
        if retries > 0:
            self._child(self.retries, record.model, record.outcome).inc(retries)
        if record.hedge is not None:
            hedge = record.hedge
            self._child(self.hedges, record.model, hedge.winner).inc()
            self._child(self.hedge_tokens, record.model, hedge.loser).inc(hedge.duplicate_tokens_in)

    # --- tracing ------------------------------------------------------------------------

    def start_request(self, path: str, model: str, headers: Iterable[tuple[bytes, bytes]]) -> Span | None:
        if self.tracer is None:
            return None
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in headers
            if k in (b"traceparent", b"tracestate")
        }
        operation = PATHS[path].operation if path in PATHS else "chat"
        return self.tracer.start_span(
            f"{operation} {model}",
            context=extract(carrier),
            kind=SpanKind.SERVER,
            attributes={GEN_AI_OPERATION: operation, GEN_AI_REQUEST_MODEL: model},
        )

    def start_attempt(self, parent: Span | None, number: int, endpoint: Endpoint) -> Span | None:
        if self.tracer is None or parent is None:
            return None
        url = httpx.URL(endpoint.base_url)
        return self.tracer.start_span(
            f"attempt {endpoint.name}",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            attributes={
                ATTEMPT: number,
                ROUTE: endpoint.name,
                KIND: endpoint.kind.value,
                GEN_AI_RESPONSE_MODEL: endpoint.model,
                SERVER_ADDRESS: url.host,
                SERVER_PORT: url.port or (443 if url.scheme == "https" else 80),
            },
        )


def trace_headers(span: Span | None) -> list[tuple[bytes, bytes]]:
    """W3C trace context for an upstream request made inside `span`."""
    if span is None:
        return []
    carrier: dict[str, str] = {}
    inject(carrier, context=trace.set_span_in_context(span))
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]


class StoreHealth(Protocol):
    """The state store as health reports read it."""

    name: str

    @property
    def degraded(self) -> bool:
        """True while shared state is unreachable and decisions are local."""

    @property
    def fallback_admissions(self) -> int:
        """Slots granted locally because the shared store was unreachable."""


class _LiveGauges(Collector):
    def __init__(
        self, snapshot: Callable[[], Snapshot], store: StoreHealth, economics: dict[str, dict[str, float]]
    ) -> None:
        self._snapshot = snapshot
        self._store = store
        self._economics = economics

    def collect(self) -> Iterable[PromMetric]:
        snapshot = self._snapshot()
        in_flight = GaugeMetricFamily(
            "tidegate_in_flight", "Requests holding a dedicated slot (all replicas)", labels=["pool"]
        )
        depth = GaugeMetricFamily(
            "tidegate_queue_depth", "In flight plus waiting for a dedicated slot", labels=["pool"]
        )
        for pool, n in snapshot.in_flight.items():
            in_flight.add_metric([pool], n)
            depth.add_metric([pool], snapshot.queue_depth(pool))
        degraded = GaugeMetricFamily(
            "tidegate_state_store_degraded", "1 while the shared store is unreachable"
        )
        degraded.add_metric([], 1.0 if self._store.degraded else 0.0)
        fallback = CounterMetricFamily(
            "tidegate_state_store_fallback_admissions",
            "Slots granted locally while the shared store was unreachable",
        )
        fallback.add_metric([], self._store.fallback_admissions)
        return [in_flight, depth, degraded, fallback, *self._economics_gauges()]

    def _economics_gauges(self) -> list[PromMetric]:
        described = {
            "utilization": "Busy slot-seconds / capacity over the last economics window (all replicas)",
            "desired_replicas": "Replicas that would carry the window's dedicated demand at 70% utilization",
            "usd_per_hour": "Provisioned price of the endpoint now (gpus x $/GPU-hour x replicas in force)",
        }
        families: list[PromMetric] = []
        for gauge, text in described.items():
            family = GaugeMetricFamily(f"tidegate_dedicated_{gauge}", text, labels=["endpoint"])
            for endpoint, values in sorted(self._economics.items()):
                if gauge in values:
                    family.add_metric([endpoint], values[gauge])
            families.append(family)
        return families
