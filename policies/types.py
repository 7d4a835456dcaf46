"""The vocabulary policies decide in: endpoint kinds, route names, windowed latency figures,
the snapshot of shared state, and the little a policy may know of an endpoint. It lives here
so that `policies` imports nothing from the gateway: `router` builds these values and imports
them from here, never the reverse (an import-linter contract in pyproject.toml holds that rule)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar


class EndpointKind(StrEnum):
    DEDICATED = "dedicated"
    SERVERLESS = "serverless"


class Target(Protocol):
    """What a policy reads of an endpoint: its name, its kind, and its slots (dedicated only;
    None for serverless). The gateway's endpoint configs satisfy it as they are."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> EndpointKind: ...

    @property
    def max_concurrency(self) -> int | None: ...


T = TypeVar("T", bound=Target)


def is_dedicated(target: Target) -> bool:
    return target.kind is EndpointKind.DEDICATED


def route_key(model: str, endpoint: str) -> str:
    """The name of a route (model, endpoint) in stores, snapshots and metrics."""
    return f"{model}/{endpoint}"


@dataclass(frozen=True, slots=True)
class Figures:
    """Summary of a latency histogram: milliseconds, `cv` as a fraction (std / mean)."""

    samples: int
    p50: float
    p95: float
    p99: float
    mean: float
    cv: float


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """A dedicated pool's time to first token as a function of the prompt tokens ahead of it:
    `overhead_ms` + tokens / `tokens_per_s` (learned from its measured TTFTs, or the prior),
    and `error_ms`, how far its measured TTFTs ran over that line (the 95th percentile of the
    fit's residuals; 0 for a prior). Admission adds the error: a request predicted exactly at
    the budget would miss it about half the time."""

    tokens_per_s: float
    overhead_ms: float
    samples: int = 0  # the measurements it was fitted to; 0: the configured prior
    error_ms: float = 0.0

    def ttft_ms(self, tokens: float) -> float:
        """The line: the TTFT expected behind `tokens` prompt tokens (this request's included)."""
        return self.overhead_ms + 1000.0 * tokens / self.tokens_per_s

    def ttft_p95_ms(self, tokens: float) -> float:
        """The line plus the measured error: what admission holds to the budget."""
        return self.ttft_ms(tokens) + self.error_ms

    def tokens_within(self, budget_ms: float) -> int:
        """The most prompt tokens that can be waiting for prefill with the TTFT (the line plus
        the error) within budget."""
        return max(0, int((budget_ms - self.error_ms - self.overhead_ms) * self.tokens_per_s / 1000.0))


@dataclass(frozen=True, slots=True)
class EngineQueue:
    """What a dedicated pool's engine says waits in its queue: every client's requests, not
    only tidegate's (vLLM's `num_requests_waiting`, this process's dispatches since the scrape
    folded in), and the mean prompt of its finished requests (`request_prompt_tokens`)."""

    waiting: float
    mean_prompt_tokens: float | None = None  # None: nothing finished yet

    def prompt_tokens(self, fallback: int) -> float:
        """The prompt tokens waiting, each request sized as the mean (or `fallback`)."""
        size = self.mean_prompt_tokens if self.mean_prompt_tokens is not None else fallback
        return self.waiting * size


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the state store knows now. `now` is a monotonic time in seconds; `in_flight` maps a
    dedicated pool name to the leases held on it across every process sharing the store and
    `waiting` to the requests in line for one; `canary_percent` holds the live canary
    overrides set through the admin API; `ttft` and `e2e` hold each route's figures over the
    latency window (routes with no samples are absent). The last two sets are verdicts the
    gateway's signal loop adds (see router/signals/loop.py), by route key and by pool name."""

    now: float
    in_flight: Mapping[str, int] = field(default_factory=dict)
    waiting: Mapping[str, int] = field(default_factory=dict)
    canary_percent: Mapping[str, float] = field(default_factory=dict)  # model -> live override
    ttft: Mapping[str, Figures] = field(default_factory=dict)  # route key -> figures
    e2e: Mapping[str, Figures] = field(default_factory=dict)
    circuit_open: Mapping[str, float] = field(default_factory=dict)  # route key -> cooldown end (`now` clock)
    slo_breached: frozenset[str] = frozenset()  # route keys over their SLO (with hysteresis)
    engine_saturated: frozenset[str] = frozenset()  # pools whose engine says stop dispatching
    # model -> serverless endpoint names, fastest first, as `tidegate probe --apply` measured
    # them: `fastest` orders routes without live figures by it
    probe_order: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # model -> endpoints whose last applied `tidegate parity` verdict is `diverges`
    parity_diverges: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # pool -> prompt tokens admitted and not yet at their first token (every process's)
    pending_prompt_tokens: Mapping[str, int] = field(default_factory=dict)
    prefill: Mapping[str, PrefillModel] = field(default_factory=dict)  # pool -> its TTFT model
    engine_queue: Mapping[str, EngineQueue] = field(default_factory=dict)  # pool -> its engine's queue, fresh

    def queue_depth(self, pool: str) -> int:
        """Requests holding a slot on `pool` plus those in line for one."""
        return self.in_flight.get(pool, 0) + self.waiting.get(pool, 0)

    def half_open(self, route: str) -> bool:
        """`route`'s circuit was opened and its cooldown is over: the next attempt is a trial."""
        until = self.circuit_open.get(route)
        return until is not None and until <= self.now
