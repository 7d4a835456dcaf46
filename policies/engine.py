"""Engine signal: stop dispatching to a dedicated engine whose own queue is building.

vLLM's gauges (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`) see load from every client, not only tidegate's, but they lag by a
scrape. So the waiting queue is estimated as scraped waiting + requests dispatched since the
scrape - requests completed since - the running slots that were still free, and the
verdict is a latch with on/off thresholds and a dwell time (policies/hysteresis.py): spill
*before* the engine's queue builds, not after errors. A sample older than `stale_after_s` is
not trusted: the per-endpoint `on_stale` says whether that means spill or trust the leases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import Reason, RequestContext
from policies.hysteresis import Latch, Thresholds
from policies.pipeline import drop_dedicated
from policies.settings import EngineSignalSettings
from policies.types import Snapshot, T


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape of an engine's gauges plus what this process did since (counts)."""

    waiting: float
    running: float
    kv_cache: float  # fraction in [0, 1]
    scraped_at: float  # monotonic seconds
    max_running: float = float("inf")  # sequences the engine runs at once
    dispatched_since: int = 0
    completed_since: int = 0
    mean_prompt_tokens: float | None = None  # of its finished requests (None: none yet, or not exported)

    def estimated_waiting(self) -> float:
        """Requests in the engine's queue now: new arrivals fill free running slots first."""
        free = 0.0 if self.waiting > 0 else max(0.0, self.max_running - self.running)
        return max(0.0, self.waiting + self.dispatched_since - self.completed_since - free)


@dataclass(frozen=True, slots=True)
class EngineLatches:
    waiting: Latch = field(default_factory=Latch)
    kv_cache: Latch = field(default_factory=Latch)

    @property
    def saturated(self) -> bool:
        return self.waiting.on or self.kv_cache.on


def engine_step(
    latches: EngineLatches, sample: EngineSample | None, signal: EngineSignalSettings, now: float
) -> tuple[EngineLatches, bool]:
    """The new latches and whether to spill. A stale or missing sample leaves the latches as
    they were and decides by `on_stale`."""
    if sample is None or now - sample.scraped_at > signal.stale_after_s:
        return latches, signal.on_stale == "spill"
    waiting = Thresholds(signal.waiting_on, signal.waiting_off, signal.dwell_s)
    kv_cache = Thresholds(signal.kv_cache_on, signal.kv_cache_off, signal.dwell_s)
    stepped = EngineLatches(
        waiting.step(latches.waiting, sample.estimated_waiting(), now),
        kv_cache.step(latches.kv_cache, sample.kv_cache, now),
    )
    return stepped, stepped.saturated


class EngineGate:
    """A filter: removes dedicated candidates whose engine says stop (`saturated`)."""

    def filter(
        self, context: RequestContext, snapshot: Snapshot, candidates: tuple[T, ...]
    ) -> tuple[tuple[T, ...], Reason | None]:
        if not snapshot.engine_saturated:
            return candidates, None
        return drop_dedicated(candidates, lambda d: d.name in snapshot.engine_saturated, Reason.SATURATED)
