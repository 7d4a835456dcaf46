"""Baseline to dedicated while its pool has room; when it is full, wait in line for a slot if
that is expected to be quicker than serverless, otherwise straight to serverless."""

from __future__ import annotations

from policies.base import Decision, Reason, RequestContext
from router.config import DedicatedEndpoint, Endpoint, ServerlessEndpoint
from router.latency import route_key
from router.state.base import Snapshot


class DedicatedFirst:
    """Dedicated endpoints with free slots (per the snapshot) first, then serverless.

    A full dedicated pool is left out and the decision says `saturated`, so a request does
    not pay an acquire attempt it is bound to lose, unless the model allows a wait in line
    (`routing.max_queue_ms`) and the expected wait beats the first serverless route's p95 TTFT.
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
        queue_ms = worth_waiting_ms(context, snapshot, dedicated[0], serverless[0])
        if queue_ms > 0:
            return Decision((dedicated[0], *serverless), Reason.BASELINE, queue_ms)
        return Decision(tuple(serverless), Reason.SATURATED)


def expected_wait_ms(context: RequestContext, snapshot: Snapshot, pool: DedicatedEndpoint) -> float | None:
    """How long a newcomer would wait for a slot on `pool`: one mean service time (windowed
    e2e of the route) per `max_concurrency` requests ahead of it. None before any figures."""
    service = snapshot.e2e.get(route_key(context.model, pool.name))
    if service is None:
        return None
    ahead = snapshot.waiting.get(pool.name, 0) + 1
    return ahead * service.mean / pool.max_concurrency


def worth_waiting_ms(
    context: RequestContext, snapshot: Snapshot, pool: DedicatedEndpoint, spill: ServerlessEndpoint
) -> float:
    """The wait in line to allow (ms); 0 means spill now. The wait is bounded by
    `routing.max_queue_ms` and only allowed when expected to end before the spill route's
    p95 TTFT (unknown figures on either side: the bound alone decides)."""
    limit = context.config.routing.max_queue_ms
    if limit <= 0:
        return 0.0
    expected = expected_wait_ms(context, snapshot, pool)
    spill_ttft = snapshot.ttft.get(route_key(context.model, spill.name))
    if expected is None or spill_ttft is None:
        return limit
    if expected >= min(limit, spill_ttft.p95):
        return 0.0
    return limit
