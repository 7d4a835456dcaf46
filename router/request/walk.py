"""One request's walk over the targets its policy chose, and what the client is told of it.

The walk owns the cursor (the next target to try, wrapping round the decision's list), the
last target tried, the attempts made, and the reason: the policy's, turned `saturated` when
a dedicated target had no room and `failover` when an attempt failed and the next one goes
elsewhere. The dispatcher asks it where to go and tells it what happened; nothing else moves
its cursor or rewrites its reason. Every `x-tidegate-*` response header comes from
`tidegate_headers`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic

from policies.base import Placed, Reason
from policies.types import T, is_dedicated
from router.record.records import Attempt, Outcome


@dataclass(slots=True)
class Walk(Generic[T]):
    targets: tuple[T, ...]
    reason: Reason
    attempts: list[Attempt] = field(default_factory=list)
    last: T | None = None  # the target of the latest attempt (None before the first)
    hedged: bool = False  # a hedge raced the first attempt (its attempt is among `attempts`)
    placement: Placed | None = None  # why the first target (a dedicated replica) is first
    _full: bool = False  # a dedicated target had no room for the request
    _cursor: int = 0

    def ahead(self) -> Iterator[tuple[int, T]]:
        """Each target from the cursor on, once round, with how many come before it."""
        count = len(self.targets)
        for skipped in range(count):
            yield skipped, self.targets[(self._cursor + skipped) % count]

    @property
    def next(self) -> T:
        """The target the cursor is on: the next attempt's first choice."""
        return self.targets[self._cursor % len(self.targets)]

    def saturated(self) -> None:
        """A dedicated target had no room for the request: it moves past it. The request is
        `saturated` once it leaves the dedicated pool (or finds every replica full), not when
        another replica of the pool takes it."""
        self._full = True

    def pool_full(self) -> None:
        """Every dedicated target was full and there is nowhere else to go."""
        self.reason = Reason.SATURATED

    def begin(self, target: T, skipped: int) -> None:
        """An attempt goes to `target`, `skipped` targets past the cursor. Going elsewhere
        than the failed attempt before it is a failover; going serverless past a full
        dedicated replica is a spill for want of room."""
        self._cursor += skipped
        if self.attempts and self.attempts[-1].error is not None and target != self.last:
            self.reason = Reason.FAILOVER
        elif self._full and not is_dedicated(target):
            self.reason = Reason.SATURATED
        self.last = target

    @property
    def placed(self) -> Placed | None:
        """Why the request is on the dedicated replica it is on: the placer's reason for
        the one it placed first, `overflow` for a later one that took it when that was full."""
        last = self.last
        if self.placement is None or last is None or not is_dedicated(last):
            return None
        return self.placement if last == self.targets[0] else Placed.OVERFLOW

    @property
    def retries(self) -> int:
        """Attempts after the first, the hedge's not counted (it is no retry)."""
        return max(0, len(self.attempts) - 1 - self.hedged)

    def failed(self, attempt: Attempt) -> None:
        """The attempt at the cursor failed before the first byte: the cursor moves on."""
        self.attempts.append(attempt)
        self._cursor += 1

    def ended(self, attempt: Attempt) -> None:
        """The attempt ended otherwise (served, cancelled, a bug): the cursor stays."""
        self.attempts.append(attempt)

    @property
    def fails_over(self) -> bool:
        """Whether the next attempt goes to another endpoint than the last one."""
        return self.next != self.last

    def served_outcome(self) -> Outcome:
        """How a served request's attempts went: first try, served by the endpoint of its
        first attempt (`retried_ok`), or by another one (`failed_over_ok`); or hedged."""
        if self.hedged:
            return Outcome.HEDGED_OK
        if len(self.attempts) <= 1:
            return Outcome.FIRST_TRY
        if self.last is not None and self.attempts[0].endpoint == self.last.name:
            return Outcome.RETRIED_OK
        return Outcome.FAILED_OVER_OK


def tidegate_headers(
    walk: Walk[T],
    outcome: Outcome | None = None,
    overhead_ms: float | None = None,
    upstream_model: str | None = None,
) -> dict[str, str]:
    """Where the request went and why: `x-tidegate-route` and `-kind` (once a target was
    tried), `-reason`, `-placement` (among two or more dedicated replicas), `-attempts` and
    `-outcome` (once known), `-overhead-ms` and
    `-upstream-model` (the id the serving endpoint knows the model by; served answers)."""
    headers = {"x-tidegate-reason": walk.reason.value}
    if walk.last is not None:
        headers["x-tidegate-route"] = walk.last.name
        headers["x-tidegate-kind"] = walk.last.kind.value
    if outcome is not None:
        headers["x-tidegate-attempts"] = str(len(walk.attempts))
        headers["x-tidegate-outcome"] = outcome.value
    placed = walk.placed
    if placed is not None:
        headers["x-tidegate-placement"] = placed.value
    if overhead_ms is not None:
        headers["x-tidegate-overhead-ms"] = f"{overhead_ms:.3f}"
    if upstream_model is not None:
        headers["x-tidegate-upstream-model"] = upstream_model
    return headers
