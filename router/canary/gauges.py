"""tidegate_canary_percent{model}: the live percent every replica obeys, at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.types import Snapshot
from router.config import GatewayConfig


class CanaryGauges(Collector):
    """tidegate_canary_percent{model}: the live percent every replica obeys."""

    def __init__(self, config: GatewayConfig, snapshot: Callable[[], Snapshot]) -> None:
        self._config = config
        self._snapshot = snapshot

    def collect(self) -> Iterable[GaugeMetricFamily]:
        live = self._snapshot().canary_percent
        family = GaugeMetricFamily("tidegate_canary_percent", "The canary percent in force", labels=["model"])
        for name, model in self._config.models.items():
            family.add_metric([name], live.get(name, model.canary_percent))
        return [family]
