"""A policy built from steps: filters narrow the candidates, then a picker orders them.

Contract: a filter returns a non-empty subset of the candidates it was given (in their
order) plus a reason when it removed something; the first filter reason wins over the
picker's, because it explains why the preferred target was never considered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.base import Decision, Policy, Reason, RequestContext
from router.config import Endpoint
from router.state.base import Snapshot


class Filter(Protocol):
    def filter(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[Endpoint, ...]
    ) -> tuple[tuple[Endpoint, ...], Reason | None]: ...


class Pipeline:
    def __init__(self, filters: Sequence[Filter], picker: Policy) -> None:
        self._filters = tuple(filters)
        self._picker = picker

    def decide(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[Endpoint, ...]
    ) -> Decision:
        reason: Reason | None = None
        for step in self._filters:
            kept, why = step.filter(context, snapshot, candidates)
            if kept and why is not None:
                candidates, reason = kept, reason or why
        decision = self._picker.decide(context, snapshot, candidates)
        if reason is None or decision.reason is Reason.SATURATED:
            return decision
        return Decision(decision.targets, reason)
