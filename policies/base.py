"""The policy seam.

A policy is `decide(context, snapshot, candidates) -> Decision`: pure, no I/O, no clock (the
time is `snapshot.now`), no globals. `candidates` are the model's endpoints in configured
order (dedicated first, then serverless in preference order). The Decision's `targets` are
the endpoints to try, best first; it is never empty when `candidates` is not. `reason` is a
stable code that reaches the response header, the log line and the metrics.

Admission is not a policy's job: a dedicated target in the list is only a wish, the
dispatcher acquires its slot atomically and spills to the next target (`saturated`) when
the pool is full.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Generic, Protocol

from policies.types import Snapshot, T


class Reason(StrEnum):
    BASELINE = "baseline"  # dedicated had room
    SATURATED = "saturated"  # dedicated was full, spilled
    SLO_BREACH = "slo_breach"
    CANARY_OUT = "canary_out"
    CIRCUIT_OPEN = "circuit_open"
    FAILOVER = "failover"  # an earlier target failed before the first byte
    SERVERLESS_ONLY = "serverless_only"  # the model has no dedicated endpoint
    PREDICTED_SLOW = "predicted_slow"  # the predicted TTFT was over budget on every open dedicated pool
    HEDGED = "hedged"  # dedicated's first token was slow: a serverless hedge answered first

    @property
    def is_spill(self) -> bool:
        """Whether the request left its model's first choice (counted in the spill
        figures): every reason but dedicated having room and a model with no dedicated."""
        return self not in (Reason.BASELINE, Reason.SERVERLESS_ONLY)


class Placed(StrEnum):
    """Why a request went to the dedicated replica it went to (policies/placement.py): the
    `x-tidegate-placement` header and the record's `placement`."""

    PREFIX_AFFINITY = "prefix_affinity"  # it probably holds the prompt's prefix in cache
    SESSION_AFFINITY = "session_affinity"  # it is the session's home
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    LISTED = "listed"
    OVERFLOW = "overflow"  # the replica placed first was full when asked: a later one took it


NO_HITS: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RequestContext:
    """The request, as far as a policy needs it. A step's parameters (the model's canary
    percent, its queue bound, ...) are bound when its pipeline is built, not carried here."""

    model: str
    stream: bool
    stickiness_key: str | None
    prompt_tokens: int = 0  # estimated from the body (router/openai.py)
    canary_exempt: bool = False  # a batch request the canary gate lets through (routing.batch.canary)
    session: str | None = None  # x-tidegate-session, else the task id: placement's session affinity
    # dedicated replica -> the share of the prompt's prefix blocks it probably holds in cache
    prefix_hits: Mapping[str, float] = field(default_factory=lambda: NO_HITS)  # shared, read-only
    # placement's tie-break without a session: the request's `user`, else its prompt's first block
    # (a new shared system prompt then lands on one replica from every gateway replica)
    placement_key: str | None = None


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    """`queue_ms` > 0 lets the dispatcher wait in line that long for the first target's slot
    (a dedicated endpoint) before it spills to the next target."""

    targets: tuple[T, ...]
    reason: Reason
    queue_ms: float = 0.0
    # pool -> the most prompt tokens it may have pending for prefill once this request is in:
    # the store admits within it atomically (predicted-TTFT admission); absent: slots alone
    admit_within: Mapping[str, int] = field(default_factory=dict)
    placement: Placed | None = None  # why the first dedicated target is first (two or more replicas)


class Policy(Protocol):
    def decide(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> Decision[T]: ...
