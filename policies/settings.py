"""Every setting a policy step reads, declared once, as protocols.

The gateway's config models satisfy them (mypy checks it where router/app.py builds a model's
policy and where router/signals/loop.py steps the latches), and policies import nothing from
the gateway. A step that reads a new setting adds one property here and nowhere else.
"""

from __future__ import annotations

from typing import Protocol

from policies.placement import Placement, Weights
from policies.predicted_ttft import Admission
from policies.serverless import ServerlessOrder


class PlacementSettings(Protocol):
    """`routing.placement`: how the dedicated replicas are ordered."""

    @property
    def mode(self) -> Placement: ...

    @property
    def weights(self) -> Weights: ...


class RoutingSettings(Protocol):
    """`routing`: the serverless order, the queue bound, admission and placement."""

    @property
    def serverless(self) -> ServerlessOrder: ...

    @property
    def min_samples(self) -> int: ...

    @property
    def explore_percent(self) -> float: ...

    @property
    def max_queue_ms(self) -> float: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def placement(self) -> PlacementSettings: ...


class SloSettings(Protocol):
    """`slo`: the TTFT target the SLO guard latches on and the admission budget it implies."""

    @property
    def ttft_p95_ms(self) -> float | None: ...

    @property
    def recover_ratio(self) -> float: ...

    @property
    def min_samples(self) -> int: ...

    @property
    def dwell_s(self) -> float: ...

    @property
    def admission_budget_ms(self) -> float | None: ...


class ParitySettings(Protocol):
    """`parity`: whether a route that failed the suite is kept out."""

    @property
    def enforce(self) -> bool: ...


class EngineSignalSettings(Protocol):
    """An endpoint's `engine_signal`: the thresholds of the engine gate's latches."""

    @property
    def stale_after_s(self) -> float: ...

    @property
    def on_stale(self) -> str: ...

    @property
    def waiting_on(self) -> float: ...

    @property
    def waiting_off(self) -> float: ...

    @property
    def kv_cache_on(self) -> float: ...

    @property
    def kv_cache_off(self) -> float: ...

    @property
    def dwell_s(self) -> float: ...


class ModelSettings(Protocol):
    """A model's settings, as a policy factory reads them."""

    @property
    def canary_percent(self) -> float: ...

    @property
    def routing(self) -> RoutingSettings: ...

    @property
    def slo(self) -> SloSettings: ...

    @property
    def parity(self) -> ParitySettings: ...
