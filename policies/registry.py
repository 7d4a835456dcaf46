"""Policies by name, so a model's config names its policy and no code compares strings.

A factory gets the model's settings and builds that model's pipeline, binding each step's
parameters then (the canary percent, the queue bound, the serverless order's thresholds), so
a decision carries only the request. Optional steps are chosen from tables keyed by settings
(`routing.serverless`), never by if/elif. The settings are the protocols of policies/settings.py:
the gateway's config satisfies them, and policies import nothing from the gateway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from policies.base import Policy
from policies.canary import CanaryGate
from policies.dedicated_first import DedicatedFirst
from policies.engine import EngineGate
from policies.health import CircuitGate
from policies.parity import ParityGate
from policies.pipeline import Pipeline, Sorter
from policies.placement import Placer
from policies.predicted_ttft import Admission, PredictedTtftFirst
from policies.serverless import FastestServerless, ServerlessOrder
from policies.settings import ModelSettings, RoutingSettings
from policies.slo import SloGuard

PolicyFactory = Callable[[ModelSettings], Policy]

SERVERLESS_ORDERS: Mapping[ServerlessOrder, Callable[[RoutingSettings], tuple[Sorter, ...]]] = (
    MappingProxyType(
        {
            ServerlessOrder.CONFIGURED: lambda routing: (),
            ServerlessOrder.FASTEST: lambda routing: (
                FastestServerless(routing.min_samples, routing.explore_percent),
            ),
        }
    )
)


def _budget_ms(model: ModelSettings) -> float:
    budget = model.slo.admission_budget_ms
    if budget is None:  # the config refuses predicted_ttft without a budget
        raise ValueError("predicted_ttft admission needs slo.ttft_budget_ms (or slo.ttft_p95_ms)")
    return budget


PICKERS: Mapping[Admission, Callable[[ModelSettings], Policy]] = MappingProxyType(
    {
        Admission.SLOTS: lambda model: DedicatedFirst(model.routing.max_queue_ms),
        Admission.PREDICTED_TTFT: lambda model: PredictedTtftFirst(_budget_ms(model)),
    }
)


def _dedicated_first(model: ModelSettings) -> Policy:
    """canary gate -> parity gate -> circuit gate -> SLO guard -> engine signal -> serverless order ->
    placement among the dedicated replicas -> dedicated first: by free slots (with the optional
    wait in line for one), or by predicted TTFT (`routing.admission`)."""
    return Pipeline(
        filters=(
            CanaryGate(model.canary_percent),
            ParityGate(model.parity.enforce),
            CircuitGate(),
            SloGuard(),
            EngineGate(),
        ),
        sorters=SERVERLESS_ORDERS[model.routing.serverless](model.routing),
        picker=PICKERS[model.routing.admission](model),
        placer=Placer(model.routing.placement.mode, model.routing.placement.weights),
    )


BUILTIN: Mapping[str, PolicyFactory] = MappingProxyType({"dedicated_first": _dedicated_first})


def build(name: str, model: ModelSettings, registry: Mapping[str, PolicyFactory] = BUILTIN) -> Policy:
    try:
        factory = registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise KeyError(f"unknown policy {name!r} (known: {known})") from None
    return factory(model)
