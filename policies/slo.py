"""SLO guard: spill new requests off a dedicated route whose windowed p95 TTFT breaks the
model's `slo.ttft_p95_ms` (`slo_breach`), until it recovers.

The verdict is a latch (policies/hysteresis.py): on when the p95 over the latency window is
over the SLO, off when it is at or under `recover_ratio` x SLO, or when the window holds fewer
than `min_samples` (the breached route gets no new traffic, so its slow samples age out of the
window and the route is tried again: that is its trial). The gateway's signal loop steps the
latches (router/signals/loop.py) and puts the breached routes in the snapshot; the filter only
reads them.
"""

from __future__ import annotations

from policies.base import Reason, RequestContext
from policies.hysteresis import Latch, Thresholds
from policies.pipeline import drop_dedicated
from policies.settings import SloSettings
from policies.types import Figures, Snapshot, T, route_key


def slo_step(latch: Latch, figures: Figures | None, slo: SloSettings, now: float) -> Latch:
    """The route's breach latch after seeing its windowed TTFT figures at `now`."""
    if slo.ttft_p95_ms is None:
        return Latch()
    p95 = figures.p95 if figures is not None and figures.samples >= slo.min_samples else None
    thresholds = Thresholds(slo.ttft_p95_ms, slo.ttft_p95_ms * slo.recover_ratio, slo.dwell_s)
    return thresholds.step(latch, p95, now)


class SloGuard:
    """A filter: removes dedicated candidates whose route is in breach (`slo_breach`)."""

    def filter(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[tuple[T, ...], Reason | None]:
        if not snapshot.slo_breached:
            return candidates, None
        breached = snapshot.slo_breached
        return drop_dedicated(
            candidates, lambda d: route_key(context.model, d.name) in breached, Reason.SLO_BREACH
        )
