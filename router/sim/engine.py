"""Capacity models: a dedicated replica with shared throughput, and elastic serverless.

`Engine.sequence(input_tokens)` is an async context manager around one request: it waits
for admission, then yields an `EngineSequence` whose `first_token()` sleeps until the first token
is ready and whose `next_token()` sleeps one inter-token interval. Counters feed /sim/stats
and /metrics. One event loop; no locks needed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from router.offline.calibration import ColdLoad
from router.sim.profile import Kind, SimProfile


@dataclass(slots=True)
class Counters:
    requests: int = 0  # every generation or embedding request, an injected fault's too
    running: int = 0
    max_running: int = 0
    queued: int = 0
    max_in_flight: int = 0
    completed: int = 0
    completed_prompt_tokens: int = 0  # vLLM's request_prompt_tokens histogram: sum (count: completed)
    cancelled: int = 0
    cold_starts: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    # the tokens of every usage object sent (a stream's only with include_usage) and the
    # output events a cut stream sent before the cut: what a gateway can bill and count
    usage_prompt_tokens: int = 0
    usage_completion_tokens: int = 0
    cut_output_events: int = 0
    queue_waits_s: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    # the real seconds each request was held before its first token (the modelled TTFT):
    # what a gateway timing its attempts must see at least
    first_token_delays_s: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))

    @property
    def in_flight(self) -> int:
        return self.running + self.queued


class EngineSequence:
    def __init__(self, engine: Engine, input_tokens: int, queue_wait_s: float) -> None:
        self._engine = engine
        self._input_tokens = input_tokens
        self.queue_wait_s = queue_wait_s

    async def first_token(self) -> None:
        await asyncio.sleep(self._engine.time_to_first_token(self._input_tokens))

    async def next_token(self, count: int = 1) -> None:
        """Sleep `count` inter-token intervals (the batch size read once, at the start)."""
        await asyncio.sleep(self._engine.inter_token_interval() * count)


class Engine:
    def __init__(
        self, profile: Callable[[], SimProfile], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._profile = profile
        self._clock = clock
        p = profile()
        self._rng = random.Random(p.seed)
        self.counters = Counters()
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._prefill_free_at = 0.0
        self._cold = ColdLoad(last_seen=clock(), ready_at=clock())

    @property
    def rng(self) -> random.Random:
        return self._rng

    @asynccontextmanager
    async def sequence(self, input_tokens: int) -> AsyncIterator[EngineSequence]:
        c = self.counters
        queued_at = time.monotonic()
        await self._admit()
        c.max_running = max(c.max_running, c.running)
        wait = time.monotonic() - queued_at
        c.queue_waits_s.append(wait)
        try:
            yield EngineSequence(self, input_tokens, wait)
            c.completed += 1
            c.completed_prompt_tokens += input_tokens
        except BaseException:
            c.cancelled += 1
            raise
        finally:
            self._release()

    def count_request(self) -> None:
        self.counters.requests += 1

    def count_fault(self, name: str) -> None:
        self.counters.faults[name] = self.counters.faults.get(name, 0) + 1

    async def _admit(self) -> None:
        c, p = self.counters, self._profile()
        if p.kind is Kind.SERVERLESS or (c.running < p.max_concurrency and not self._waiting):
            c.running += 1
            c.max_in_flight = max(c.max_in_flight, c.in_flight)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        c.queued = len(self._waiting)
        c.max_in_flight = max(c.max_in_flight, c.in_flight)
        try:
            await future  # resolved by _release, which hands over its slot
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot arrived together with the cancellation
            elif future in self._waiting:
                self._waiting.remove(future)
                c.queued = len(self._waiting)
            raise

    def _release(self) -> None:
        c = self.counters
        while self._waiting:
            future = self._waiting.popleft()
            c.queued = len(self._waiting)
            if not future.done():
                future.set_result(None)  # the slot passes to the oldest waiter
                return
        c.running -= 1

    def time_to_first_token(self, input_tokens: int) -> float:
        delay = self._time_to_first_token(input_tokens)
        self.counters.first_token_delays_s.append(delay)
        return delay

    def _time_to_first_token(self, input_tokens: int) -> float:
        p = self._profile()
        if p.kind is Kind.SERVERLESS:
            return p.delay(self._serverless_ttft(p))
        now = time.monotonic()
        duration = p.delay(input_tokens / p.prefill_tokens_per_s)
        start = max(now, self._prefill_free_at)  # one prefill budget for the whole replica
        self._prefill_free_at = start + duration
        return self._prefill_free_at - now + p.delay(p.overhead_s)

    def inter_token_interval(self) -> float:
        p = self._profile()
        if p.kind is Kind.SERVERLESS:
            return p.delay(p.serverless_itl_s)
        return p.delay(p.decode_step_s(self.counters.running))

    def _serverless_ttft(self, p: SimProfile) -> float:
        """A warm TTFT, plus the wait for a cold load: started by the first request after an
        idle gap, waited for by every request arriving before it ends (in modelled seconds)."""
        loads = self._cold.loads
        wait_real = self._cold.wait_s(
            self._clock(),
            p.idle_to_cold_s / p.time_scale,
            lambda: p.delay(self._rng.uniform(*p.ttft.cold_range_s)),
        )
        self.counters.cold_starts += self._cold.loads - loads
        return p.ttft.sample(self._rng) + wait_real / p.delay(1.0)
