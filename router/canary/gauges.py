"""Per-model and per-route gauges read from the snapshot at scrape time (all replicas): the
canary percent in force, the SLO the alert rules compare with, each route's circuit and its
TTFT spread (CV%) over the state window."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.types import Snapshot, route_key
from router.config import GatewayConfig


class ModelGauges(Collector):
    """tidegate_canary_percent, tidegate_slo_ttft_p95_seconds, tidegate_circuit_open and
    tidegate_ttft_cv_percent (see the module's docstring)."""

    def __init__(self, config: GatewayConfig, snapshot: Callable[[], Snapshot]) -> None:
        self._config = config
        self._snapshot = snapshot

    def collect(self) -> Iterable[GaugeMetricFamily]:
        snapshot = self._snapshot()
        live = snapshot.canary_percent
        family = GaugeMetricFamily("tidegate_canary_percent", "The canary percent in force", labels=["model"])
        slo = GaugeMetricFamily(
            "tidegate_slo_ttft_p95_seconds",
            "The model's configured TTFT p95 SLO (slo.ttft_p95_ms)",
            labels=["model"],
        )
        circuit = GaugeMetricFamily(
            "tidegate_circuit_open",
            "1 while the route's circuit breaker is open (all replicas)",
            labels=["model", "route"],
        )
        spread = GaugeMetricFamily(
            "tidegate_ttft_cv_percent",
            "The route's TTFT std/mean x 100 over state.window_s (all replicas)",
            labels=["model", "route"],
        )
        for name, model in self._config.models.items():
            family.add_metric([name], live.get(name, model.canary_percent))
            if model.slo.ttft_p95_ms is not None:
                slo.add_metric([name], model.slo.ttft_p95_ms / 1000)
            for endpoint in model.endpoints:
                route = route_key(name, endpoint.name)
                circuit.add_metric(
                    [name, endpoint.name], 1.0 if snapshot.circuit_open.get(route, 0) > snapshot.now else 0.0
                )
                figures = snapshot.ttft.get(route)
                if figures is not None:
                    spread.add_metric([name, endpoint.name], figures.cv * 100)
        return [family, slo, circuit, spread]
