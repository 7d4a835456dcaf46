"""Baseline to dedicated while its pool has room; when it is full, wait in line for a slot if
that is expected to be quicker than serverless, otherwise straight to serverless."""

from __future__ import annotations

from policies.base import Decision, Reason, RequestContext
from policies.types import Snapshot, T, Target, is_dedicated, route_key


class DedicatedFirst:
    """Dedicated endpoints with free slots (per the snapshot) first, then serverless.

    A full dedicated pool is left out and the decision says `saturated`, so a request does
    not pay an acquire attempt it is bound to lose, unless the model allows a wait in line
    (`max_queue_ms`, the model's `routing.max_queue_ms`) and the expected wait beats the first
    serverless route's p95 TTFT.
    """

    def __init__(self, max_queue_ms: float = 0.0) -> None:
        self._max_queue_ms = max_queue_ms

    def decide(self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]) -> Decision[T]:
        dedicated = [c for c in candidates if is_dedicated(c)]
        serverless = [c for c in candidates if not is_dedicated(c)]
        free = [d for d in dedicated if snapshot.in_flight.get(d.name, 0) < (d.max_concurrency or 0)]
        if not dedicated:
            return Decision(tuple(serverless), Reason.SERVERLESS_ONLY)
        if not serverless:
            return self._nowhere_to_spill(dedicated, free)
        if free:
            return Decision((*free, *serverless), Reason.BASELINE)
        queue_ms = worth_waiting_ms(self._max_queue_ms, context.model, snapshot, dedicated[0], serverless[0])
        if queue_ms > 0:
            return Decision((dedicated[0], *serverless), Reason.BASELINE, queue_ms)
        return Decision(tuple(serverless), Reason.SATURATED)

    def _nowhere_to_spill(self, dedicated: list[T], free: list[T]) -> Decision[T]:
        """Every dedicated pool, the free ones (per the snapshot) first, waiting in line on the
        first as long as the model allows: the snapshot lags the leases, so a pool it shows
        full may free a slot a moment later, and without a spill route the alternative to
        waiting is refusing the request."""
        if len(free) == len(dedicated):  # the usual case, in order already
            return Decision(tuple(dedicated), Reason.BASELINE, self._max_queue_ms)
        names = {f.name for f in free}
        ordered = (*free, *(d for d in dedicated if d.name not in names))
        return Decision(ordered, Reason.BASELINE if free else Reason.SATURATED, self._max_queue_ms)


def expected_wait_ms(model: str, snapshot: Snapshot, pool: Target) -> float | None:
    """How long a newcomer would wait for a slot on `pool`: one mean service time (windowed
    e2e of the route) per `max_concurrency` requests ahead of it. None before any figures."""
    service = snapshot.e2e.get(route_key(model, pool.name))
    if service is None or not pool.max_concurrency:
        return None
    ahead = snapshot.waiting.get(pool.name, 0) + 1
    return ahead * service.mean / pool.max_concurrency


def worth_waiting_ms(limit: float, model: str, snapshot: Snapshot, pool: Target, spill: Target) -> float:
    """The wait in line to allow (ms); 0 means spill now. The wait is bounded by `limit`
    (`routing.max_queue_ms`) and only allowed when expected to end before the spill route's
    p95 TTFT (unknown figures on either side: the bound alone decides)."""
    if limit <= 0:
        return 0.0
    expected = expected_wait_ms(model, snapshot, pool)
    spill_ttft = snapshot.ttft.get(route_key(model, spill.name))
    if expected is None or spill_ttft is None:
        return limit
    if expected >= min(limit, spill_ttft.p95):
        return 0.0
    return limit
