"""The signal loop: turns live figures into the verdicts policies read, with hysteresis.

Policies are pure, so whatever must remember the past (a latch that is on until a route
recovers) is stepped here, every `TICK_S`, with the pure step functions of the policy steps:
- SLO guard (policies/slo.py): each dedicated route of a model with `slo.ttft_p95_ms`, from
  the store's windowed TTFT figures (merged across replicas);
- engine signal (policies/engine.py): each dedicated pool with `engine_signal`, from its vLLM
  `/metrics` scraped every `interval_s` plus what this process dispatched and completed since.

`snapshot()` is the store's snapshot with the current verdicts added; the dispatcher asks it
for every request, so it does no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from policies.engine import EngineLatches, EngineSample, engine_step
from policies.hysteresis import Latch
from policies.predicted_ttft import Admission
from policies.slo import slo_step
from policies.types import EngineQueue, PrefillModel, Snapshot, route_key
from router.config import EngineSignalConfig, GatewayConfig, SloConfig
from router.periodic import Loops
from router.signals.prefill import PrefillLearner, SharedSamples

log = logging.getLogger("tidegate.signals")

TICK_S = 0.1
PREFILL_SYNC_S = 1.0  # share prefill measurements and refit this often
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:request_prompt_tokens"  # histogram of finished requests' prompt lengths


class EngineScrapeError(Exception):
    """An engine's /metrics could not be read or lacks the gauges we need."""


def parse_engine_metrics(text: str, scraped_at: float, max_running: float) -> EngineSample:
    """Waiting and running requests (summed over the engine's series) and KV cache usage
    (the highest)."""
    waiting: list[float] = []
    running: list[float] = []
    kv_cache: list[float] = []
    prompt_sum = prompt_count = 0.0
    try:
        for family in text_string_to_metric_families(text):
            if family.name == PROMPT_TOKENS:
                for sample in family.samples:
                    if sample.name.endswith("_sum"):
                        prompt_sum += sample.value
                    elif sample.name.endswith("_count"):
                        prompt_count += sample.value
                continue
            target = {WAITING: waiting, RUNNING: running, KV_CACHE: kv_cache}.get(family.name)
            if target is not None:
                target.extend(sample.value for sample in family.samples)
    except ValueError as exc:
        raise EngineScrapeError(f"not Prometheus text: {exc}") from exc
    if not waiting:
        raise EngineScrapeError(f"no {WAITING} gauge")
    mean_prompt = prompt_sum / prompt_count if prompt_count > 0 else None
    return EngineSample(
        sum(waiting),
        sum(running),
        max(kv_cache, default=0.0),
        scraped_at,
        max_running,
        mean_prompt_tokens=mean_prompt,
    )


class SnapshotSource(Protocol):
    """The state store as the signal loop reads it (and shares prefill measurements through
    its leases role)."""

    def snapshot(self) -> Snapshot: ...

    @property
    def leases(self) -> SharedSamples: ...


class Signals:
    def __init__(
        self,
        config: GatewayConfig,
        store: SnapshotSource,
        loops: Loops | None = None,
        *,
        metrics_url: Callable[[str], str | None] | None = None,
    ) -> None:
        """`metrics_url`: where a DNS pool's slot set's pod serves /metrics now (router/fleet/),
        None while it has none; other pools' engine_signal says where."""
        self._store = store
        self._metrics_url = metrics_url
        self._loops = loops or Loops()
        self._client: httpx.AsyncClient | None = None
        self._slo: dict[str, SloConfig] = {
            route_key(name, d.name): model.slo
            for name, model in config.models.items()
            if model.slo.ttft_p95_ms is not None
            for d in model.dedicated
        }
        self._found = {d.name for m in config.models.values() for d in m.dedicated if d.replica_dns}
        self._engines: dict[str, EngineSignalConfig] = {}
        self._max_running: dict[str, int] = {}
        for model in config.models.values():
            for d in model.dedicated:
                if d.engine_signal is not None:
                    self._engines[d.name] = d.engine_signal
                    self._max_running[d.name] = d.engine_signal.max_running or d.max_concurrency
        self._slo_latches: dict[str, Latch] = {}
        self._engine_latches: dict[str, EngineLatches] = {}
        self._samples: dict[str, EngineSample] = {}
        self._dispatched: Counter[str] = Counter()
        self._completed: Counter[str] = Counter()
        self.slo_breached: frozenset[str] = frozenset()
        self.engine_saturated: frozenset[str] = frozenset()
        self.engine_queues: dict[str, EngineQueue] = {}  # pool -> its engine's queue, stepped in tick
        self._tasks: list[asyncio.Task[None]] = []
        predicted = [m for m in config.models.values() if m.routing.admission is Admission.PREDICTED_TTFT]
        priors = {
            d.name: PrefillModel(d.prefill_tokens_per_s, d.ttft_overhead_ms)
            for m in predicted
            for d in m.dedicated
        }
        self._prefill = PrefillLearner(priors)
        self._predicting = bool(predicted)

    def snapshot(self) -> Snapshot:
        snapshot = self._store.snapshot()
        if self._predicting:
            snapshot = replace(snapshot, prefill=self._prefill.models, engine_queue=self.engine_queues)
        if not (self.slo_breached or self.engine_saturated):
            return snapshot
        return replace(snapshot, slo_breached=self.slo_breached, engine_saturated=self.engine_saturated)

    def _engine_queues(self, now: float) -> dict[str, EngineQueue]:
        """Each engine-signalled pool's queue from its last scrape, while that is fresh."""
        queues = {}
        for pool, signal in self._engines.items():
            sample = self.engine_sample(pool)
            if sample is not None and now - sample.scraped_at <= signal.stale_after_s:
                queues[pool] = EngineQueue(sample.estimated_waiting(), sample.mean_prompt_tokens)
        return queues

    def forget(self, pool: str) -> None:
        """`pool` is another engine now (a DNS pool's slot set moved): its last scrape says nothing."""
        self._samples.pop(pool, None)

    def first_token(self, pool: str, pending_tokens: int, ttft_ms: float) -> None:
        """A measurement for the pool's prefill model (predicted-TTFT admission)."""
        self._prefill.sample(pool, pending_tokens, ttft_ms)

    def dispatched(self, pool: str) -> None:
        if pool in self._engines:
            self._dispatched[pool] += 1

    def completed(self, pool: str) -> None:
        if pool in self._engines:
            self._completed[pool] += 1

    def engine_sample(self, pool: str) -> EngineSample | None:
        """The last scrape of `pool`'s engine with this process's traffic since folded in."""
        sample = self._samples.get(pool)
        if sample is None:
            return None
        return replace(sample, dispatched_since=self._dispatched[pool], completed_since=self._completed[pool])

    def tick(self, now: float) -> None:
        """Step every latch once and publish the verdicts."""
        ttft = self._store.snapshot().ttft
        for route, slo in self._slo.items():
            self._slo_latches[route] = slo_step(
                self._slo_latches.get(route, Latch()), ttft.get(route), slo, now
            )
        saturated = set()
        for pool, signal in self._engines.items():
            latches = self._engine_latches.get(pool, EngineLatches())
            self._engine_latches[pool], spill = engine_step(latches, self.engine_sample(pool), signal, now)
            if spill:
                saturated.add(pool)
        if self._predicting and self._engines:  # per tick, not per request's snapshot
            self.engine_queues = self._engine_queues(now)
        breached = frozenset(r for r, latch in self._slo_latches.items() if latch.on)
        self._log_changes(breached, frozenset(saturated))
        self.slo_breached, self.engine_saturated = breached, frozenset(saturated)

    def _log_changes(self, breached: frozenset[str], saturated: frozenset[str]) -> None:
        for route in breached ^ self.slo_breached:
            log.warning("SLO guard: %s %s", route, "breached, spilling" if route in breached else "recovered")
        for pool in saturated ^ self.engine_saturated:
            state = "saturated, spilling" if pool in saturated else "has room again"
            log.warning("engine signal: %s %s", pool, state)

    async def scrape(self, client: httpx.AsyncClient, pool: str) -> None:
        signal = self._engines[pool]
        url = self._metrics_url(pool) if self._metrics_url and pool in self._found else signal.metrics_url
        if url is None:  # a DNS pool's slot set with no pod on it now: nothing to read
            return
        try:
            response = await client.get(url, timeout=signal.interval_s)
            response.raise_for_status()
            sample = parse_engine_metrics(response.text, time.monotonic(), self._max_running[pool])
        except (httpx.HTTPError, EngineScrapeError) as exc:
            log.warning("engine signal: scraping %s failed: %s", url, exc)
            return
        self._samples[pool] = sample
        self._dispatched[pool] = self._completed[pool] = 0

    async def start(self) -> None:
        if self._tasks or not (self._slo or self._engines or self._predicting):
            return
        loop, loops = asyncio.get_running_loop(), self._loops
        self._tasks.append(loop.create_task(loops.every("signals tick", TICK_S, self._tick_now)))
        if self._predicting:
            sync = loops.every("prefill sync", PREFILL_SYNC_S, self.sync_prefill)
            self._tasks.append(loop.create_task(sync))
        if self._engines:
            self._client = httpx.AsyncClient()
            every_s = min(signal.interval_s for signal in self._engines.values())
            self._next_scrape = dict.fromkeys(self._engines, 0.0)
            self._tasks.append(loop.create_task(loops.every("engine scrape", every_s, self._scrape_due)))

    async def sync_prefill(self) -> None:
        """Share this process's prefill measurements and refit from every replica's."""
        await self._prefill.sync(self._store.leases)

    async def _tick_now(self) -> None:
        self.tick(time.monotonic())

    async def _scrape_due(self) -> None:
        """Scrape the engines whose interval has passed."""
        assert self._client is not None
        now = time.monotonic()
        due = [pool for pool, at in self._next_scrape.items() if at <= now]
        await asyncio.gather(*(self.scrape(self._client, pool) for pool in due))
        for pool in due:
            self._next_scrape[pool] = now + self._engines[pool].interval_s

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
