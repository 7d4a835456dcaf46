"""What `tidegate plan` models: a plan (dedicated replicas and the routing settings for them)
and the system it runs on (the calibrations, the gateway's window, the batch traffic), named
the way tidegate/offline/planner/model.py and the sweep use them."""

from __future__ import annotations

from dataclasses import dataclass

from tidegate.offline.calibration import DedicatedCalibration, ServerlessCalibration

SERVERLESS_ROUTE = "serverless"


def dedicated_route(index: int) -> str:
    return f"dedicated-{index}"


@dataclass(frozen=True, slots=True)
class Plan:
    """One candidate: how many dedicated replicas, and the routing settings for them."""

    replicas: int
    max_concurrency: int = 16  # slots per replica (the gateway's max_concurrency per endpoint)
    max_queue_ms: float = 0.0  # routing.max_queue_ms
    canary_percent: float = 100.0
    # routing.admission predicted_ttft with this slo.ttft_budget_ms (None: slots alone);
    # max_concurrency is then only the ceiling
    ttft_budget_ms: float | None = None
    keep_warm_s: float = 0.0  # serverless keep-warm: a 1-token request this often (0: off)

    @property
    def label(self) -> str:
        if self.replicas == 0:
            return "all-serverless" + self._warm
        canary = "" if self.canary_percent >= 100 else f" canary {self.canary_percent:g}%"
        if self.ttft_budget_ms is not None:
            admission = f"predicted<={self.ttft_budget_ms:g}ms c<={self.max_concurrency}"
        else:
            admission = f"c={self.max_concurrency} q={self.max_queue_ms:g}ms"
        return f"{self.replicas}x ded {admission}{canary}{self._warm}"

    @property
    def _warm(self) -> str:
        return f" warm/{self.keep_warm_s:g}s" if self.keep_warm_s > 0 else ""


@dataclass(frozen=True, slots=True)
class System:
    dedicated: DedicatedCalibration
    serverless: ServerlessCalibration
    window_s: float = 60.0  # the gateway's latency window (state.window_s), in trace seconds
    max_waiters: int = 64  # per dedicated endpoint (max_waiters)
    gateway_overhead_s: float = 0.0  # added to every TTFT: the gateway's own time
    # this share of the trace's requests is batch traffic (router/request/priority.py): it waits
    # for a dedicated slot outside the line, never taking the last `batch_reserve` slots, for up
    # to `batch_max_wait_s`, then is refused (routing.batch.on_timeout: reject)
    batch_share: float = 0.0
    batch_reserve: int = 1
    batch_max_wait_s: float = 300.0
    # the share of a dedicated prompt a replica's prefix cache holds (its prefill is skipped):
    # a fleet placed by prefix affinity serves more per replica (`tidegate plan --prefix-hit-rate`)
    prefix_hit_rate: float = 0.0


def keep_warm_times(plan: Plan, until_s: float) -> list[float]:
    """When the keep-warm pings go out over a trace ending at `until_s` (router/spill/keep_warm.py,
    `when: always`: from the start, every `keep_warm_s`)."""
    if plan.keep_warm_s <= 0 or plan.replicas < 0:
        return []
    return [i * plan.keep_warm_s for i in range(int(until_s // plan.keep_warm_s) + 1)]
