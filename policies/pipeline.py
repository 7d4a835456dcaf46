"""A policy built from steps: filters narrow the candidates, sorters reorder them,
a placer orders the dedicated replicas (policies/placement.py), then a picker decides.

Contract: a filter returns a non-empty subset of the candidates it was given (in their
order) plus a reason when its removal explains the decision (the parity gate removes without
one: it narrows where a spill may go, it decides no request's route); the first filter reason wins over the
picker's, because it explains why the preferred target was never considered (except
`saturated` or `predicted_slow` from the picker, which say the remaining dedicated pool was
full or predicted too slow too). A sorter
returns a permutation of its candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from policies.base import Decision, Policy, Reason, RequestContext
from policies.placement import Placer
from policies.types import Snapshot, T, Target, is_dedicated


class Filter(Protocol):
    def filter(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[tuple[T, ...], Reason | None]: ...


class Sorter(Protocol):
    def sort(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[T, ...]: ...


def drop_dedicated(
    candidates: tuple[T, ...], drop: Callable[[Target], bool], reason: Reason
) -> tuple[tuple[T, ...], Reason | None]:
    """A filter's usual answer: the candidates without the dedicated endpoints `drop` picks,
    with `reason`; all of them unchanged (no reason) when that removes nothing or everything
    (with nowhere else to go, the dedicated endpoint is still the best bet)."""
    kept = tuple(c for c in candidates if not (is_dedicated(c) and drop(c)))
    if len(kept) == len(candidates) or not kept:
        return candidates, None
    return kept, reason


class Pipeline:
    def __init__(
        self,
        filters: Sequence[Filter],
        picker: Policy,
        sorters: Sequence[Sorter] = (),
        placer: Placer | None = None,
    ) -> None:
        self._filters = tuple(filters)
        self._sorters = tuple(sorters)
        self._picker = picker
        self._placer = placer

    def decide(self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]) -> Decision[T]:
        reason: Reason | None = None
        for step in self._filters:
            kept, why = step.filter(context, snapshot, candidates)
            if kept:
                candidates = kept
                reason = reason or why
        for sorter in self._sorters:
            candidates = sorter.sort(context, snapshot, candidates)
        placed = None
        if self._placer is not None:
            candidates, whys = self._placer.place(context, snapshot, candidates)
            placed = whys or None
        decision = self._picker.decide(context, snapshot, candidates)
        if placed is not None and decision.targets:
            decision = replace(decision, placement=placed.get(decision.targets[0].name))
        if reason is None or decision.reason in (Reason.SATURATED, Reason.PREDICTED_SLOW):
            return decision
        return replace(decision, reason=reason)
