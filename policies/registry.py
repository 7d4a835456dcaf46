"""Policies by name, so a model's config names its policy and no code compares strings.

A factory gets the model's config and builds that model's pipeline; optional steps are
chosen from tables keyed by config values (`routing.serverless`), never by if/elif.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from policies.base import Policy
from policies.canary import CanaryGate
from policies.dedicated_first import DedicatedFirst
from policies.engine import EngineGate
from policies.health import CircuitGate
from policies.pipeline import Pipeline, Sorter
from policies.serverless import FastestServerless
from policies.slo import SloGuard
from router.config import ModelConfig, ServerlessOrder

PolicyFactory = Callable[[ModelConfig], Policy]

SERVERLESS_ORDERS: Mapping[ServerlessOrder, tuple[Sorter, ...]] = MappingProxyType(
    {ServerlessOrder.CONFIGURED: (), ServerlessOrder.FASTEST: (FastestServerless(),)}
)


def _dedicated_first(model: ModelConfig) -> Policy:
    """canary gate -> circuit gate -> SLO guard -> engine signal -> serverless order ->
    dedicated first (with the optional wait in line for a slot)."""
    return Pipeline(
        filters=(CanaryGate(), CircuitGate(), SloGuard(), EngineGate()),
        sorters=SERVERLESS_ORDERS[model.routing.serverless],
        picker=DedicatedFirst(),
    )


BUILTIN: Mapping[str, PolicyFactory] = MappingProxyType({"dedicated_first": _dedicated_first})


def build(name: str, model: ModelConfig, registry: Mapping[str, PolicyFactory] = BUILTIN) -> Policy:
    try:
        factory = registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown policy {name!r} (known: {known})") from None
    return factory(model)
