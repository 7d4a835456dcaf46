"""Parity gate: with `models.M.parity.enforce`, a serverless endpoint whose last applied
`tidegate parity` verdict is `diverges` leaves the spill order (snapshot `parity_diverges`,
shared by every replica through the state store).

The fallback path must pass the same production suite as the primary (the field notes): an
endpoint that answers differently is no fallback. The gate removes without a reason of its
own, since it decides no request's route, only which routes a spill may take; the routes
report shows the exclusion (`parity_diverges`). When every serverless endpoint diverges a
spill has nowhere to go and dedicated's line and its 503 answer for the model; a model with no
other endpoint keeps its candidates (a filter never empties them). Dedicated endpoints are
the canary controller's business: it holds while one diverges.
"""

from __future__ import annotations

from policies.base import Reason, RequestContext
from policies.types import Snapshot, T, is_dedicated


class ParityGate:
    def __init__(self, enforce: bool) -> None:
        self._enforce = enforce

    def filter(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[tuple[T, ...], Reason | None]:
        diverging = snapshot.parity_diverges.get(context.model) if self._enforce else None
        if not diverging:
            return candidates, None
        kept = tuple(c for c in candidates if is_dedicated(c) or c.name not in diverging)
        return (kept or candidates), None
