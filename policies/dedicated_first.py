"""Baseline to dedicated while its pool has room, otherwise straight to serverless."""

from __future__ import annotations

from policies.base import Decision, Reason, RequestContext
from router.config import DedicatedEndpoint, Endpoint, ServerlessEndpoint
from router.state.base import Snapshot


class DedicatedFirst:
    """Dedicated endpoints with free slots (per the snapshot) first, then serverless.

    A full dedicated pool is left out and the decision says `saturated`, so a request does
    not pay an acquire attempt it is bound to lose.
    """

    def decide(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[Endpoint, ...]
    ) -> Decision:
        dedicated = [c for c in candidates if isinstance(c, DedicatedEndpoint)]
        serverless = [c for c in candidates if isinstance(c, ServerlessEndpoint)]
        free = [d for d in dedicated if snapshot.in_flight.get(d.name, 0) < d.max_concurrency]
        if not dedicated:
            return Decision(tuple(serverless), Reason.SERVERLESS_ONLY)
        if free:
            return Decision((*free, *serverless), Reason.BASELINE)
        if not serverless:  # nothing to spill to: queue-less retry on dedicated
            return Decision(tuple(dedicated), Reason.SATURATED)
        return Decision(tuple(serverless), Reason.SATURATED)
