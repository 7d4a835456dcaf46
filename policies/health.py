"""Circuit gate: skip endpoints whose circuit is open (`circuit_open`); when every candidate
is open, keep the one whose cooldown ends first (panic mode) rather than failing outright.

Open circuits come from the snapshot (`circuit_open`: route key -> end of cooldown on the
snapshot's clock), shared by every replica through the state store; router/request/breaker.py
opens and closes them. A circuit whose cooldown is over is half-open: its endpoint is
eligible again, and the next attempt is its trial.
"""

from __future__ import annotations

from policies.base import Reason, RequestContext
from policies.types import Snapshot, T, route_key


class CircuitGate:
    def filter(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[tuple[T, ...], Reason | None]:
        if not snapshot.circuit_open:
            return candidates, None
        ends = {c.name: snapshot.circuit_open.get(route_key(context.model, c.name), 0.0) for c in candidates}
        closed = tuple(c for c in candidates if ends[c.name] <= snapshot.now)
        if len(closed) == len(candidates):
            return candidates, None
        if closed:
            return closed, Reason.CIRCUIT_OPEN
        soonest = min(candidates, key=lambda c: ends[c.name])  # panic mode
        return (soonest,), Reason.CIRCUIT_OPEN
