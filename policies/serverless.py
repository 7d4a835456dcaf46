"""Serverless choice `fastest`: order a model's serverless routes by their live TTFT.

A route is ranked once its window holds `routing.min_samples` TTFT samples; its score is the
p95 TTFT, doubled when its CV is over 100% (the seeds' "cold starts" verdict: a bimodal route
whose p95 can look fine until the next cold load). Unmeasured routes follow the ranked ones in
configured order (or the order `tidegate probe --apply` measured, when one was applied),
except for `routing.explore_percent` of stickiness keys, which try them
first so they get measured at all. The seeds show the fastest provider differs per model, so
this is decided per route from live figures, never from a fixed list.
"""

from __future__ import annotations

from enum import StrEnum

from policies.base import RequestContext
from policies.canary import bucket
from policies.types import Figures, Snapshot, T, is_dedicated, route_key

COLD_START_CV = 1.0
COLD_START_PENALTY = 2.0


class ServerlessOrder(StrEnum):
    """How a model's serverless routes are ordered (its `routing.serverless`)."""

    CONFIGURED = "configured"  # the order of the `serverless` list
    FASTEST = "fastest"  # by live p95 TTFT and CV% (routes with min_samples): FastestServerless


def score(figures: Figures) -> float:
    """Lower is better: p95 TTFT in ms, penalised for a cold-start CV."""
    return figures.p95 * (COLD_START_PENALTY if figures.cv > COLD_START_CV else 1.0)


class FastestServerless:
    """A sorter: reorders the serverless candidates, leaves the others first and in order.
    Built with the model's `routing.min_samples` and `routing.explore_percent`."""

    def __init__(self, min_samples: int, explore_percent: float) -> None:
        self._min_samples = min_samples
        self._explore_percent = explore_percent

    def sort(self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]) -> tuple[T, ...]:
        others = tuple(c for c in candidates if is_dedicated(c))
        measured: list[tuple[float, int, T]] = []
        unmeasured: list[T] = []
        for i, candidate in enumerate(c for c in candidates if not is_dedicated(c)):
            figures = snapshot.ttft.get(route_key(context.model, candidate.name))
            if figures is not None and figures.samples >= self._min_samples:
                measured.append((score(figures), i, candidate))
            else:
                unmeasured.append(candidate)
        ranked = [c for _, _, c in sorted(measured, key=lambda m: (m[0], m[1]))]
        probed = snapshot.probe_order.get(context.model)
        if probed:  # routes without live figures yet: in the order a probe measured them
            place = {name: i for i, name in enumerate(probed)}
            unmeasured.sort(key=lambda c: place.get(c.name, len(place)))
        if unmeasured and self._explores(context):
            return (*others, *unmeasured, *ranked)
        return (*others, *ranked, *unmeasured)

    def _explores(self, context: RequestContext) -> bool:
        key = context.stickiness_key
        return key is not None and bucket(f"{context.model}\x00explore", key) < self._explore_percent
