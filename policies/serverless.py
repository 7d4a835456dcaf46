"""Serverless choice `fastest`: order a model's serverless routes by their live TTFT.

A route is ranked once its window holds `routing.min_samples` TTFT samples; its score is the
p95 TTFT, doubled when its CV is over 100% (the seeds' "cold starts" verdict: a bimodal route
whose p95 can look fine until the next cold load). Unmeasured routes follow the ranked ones in
configured order, except for `routing.explore_percent` of stickiness keys, which try them
first so they get measured at all. The seeds show the fastest provider differs per model, so
this is decided per route from live figures, never from a fixed list.
"""

from __future__ import annotations

from policies.base import RequestContext
from policies.canary import bucket
from router.config import Endpoint, ServerlessEndpoint
from router.latency import Figures, route_key
from router.state.base import Snapshot

COLD_START_CV = 1.0
COLD_START_PENALTY = 2.0


def score(figures: Figures) -> float:
    """Lower is better: p95 TTFT in ms, penalised for a cold-start CV."""
    return figures.p95 * (COLD_START_PENALTY if figures.cv > COLD_START_CV else 1.0)


class FastestServerless:
    """A sorter: reorders the serverless candidates, leaves the others first and in order."""

    def sort(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[Endpoint, ...]
    ) -> tuple[Endpoint, ...]:
        routing = context.config.routing
        others = tuple(c for c in candidates if not isinstance(c, ServerlessEndpoint))
        measured: list[tuple[float, int, Endpoint]] = []
        unmeasured: list[Endpoint] = []
        for i, candidate in enumerate(c for c in candidates if isinstance(c, ServerlessEndpoint)):
            figures = snapshot.ttft.get(route_key(context.model, candidate.name))
            if figures is not None and figures.samples >= routing.min_samples:
                measured.append((score(figures), i, candidate))
            else:
                unmeasured.append(candidate)
        ranked = [c for _, _, c in sorted(measured, key=lambda m: (m[0], m[1]))]
        if unmeasured and self._explores(context):
            return (*others, *unmeasured, *ranked)
        return (*others, *ranked, *unmeasured)

    @staticmethod
    def _explores(context: RequestContext) -> bool:
        key = context.stickiness_key
        return (
            key is not None
            and bucket(f"{context.model}\x00explore", key) < context.config.routing.explore_percent
        )
