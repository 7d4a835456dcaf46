"""Capacity models: a dedicated replica (the shared-step vLLM V1 engine of router/engine, driven
on the event loop's clock) and elastic serverless.

`Engine.sequence(input_tokens)` is an async context manager around one request: it hands the
request to the engine and yields an `EngineSequence` whose `first_token()` waits until the
engine's step that completes its prefill has ended (plus the fixed overhead) and whose
`next_token(count)` waits until the engine has produced `count` more of its tokens. A dedicated
replica's timing is the planner's (tidegate/offline/planner/model.py runs the same engine in
trace time), so a plan and a replay against the simulator share one model: comparing them is a
consistency check, not a validation (docs/simulator.md holds the published-figure checks).
Counters feed /sim/stats and /metrics. One event loop; no locks needed.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from router.engine.replica import Replica
from router.engine.spec import EngineSpec
from tidegate.offline.calibration import ColdLoad
from tidegate.sim.prefix_cache import PrefixCache
from tidegate.sim.profile import Kind, SimProfile


@dataclass(slots=True)
class Counters:
    requests: int = 0  # every generation or embedding request, an injected fault's too
    running: int = 0
    max_running: int = 0
    queued: int = 0
    max_in_flight: int = 0
    completed: int = 0
    completed_prompt_tokens: int = 0  # vLLM's request_prompt_tokens histogram: sum (count: completed)
    prefill_tokens: int = 0  # prompt tokens the dedicated replica computed (prefix-cache hits skip theirs)
    prefix_hit_tokens: int = 0  # prompt tokens found in the prefix cache
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
    def __init__(self, engine: Engine, key: int, input_tokens: int, queued_at: float) -> None:
        self._engine = engine
        self._key = key
        self._input_tokens = input_tokens
        self._queued_at = queued_at
        self._produced = 1

    async def first_token(self) -> None:
        await self._engine.first_token(self._key, self._input_tokens)
        self._engine.counters.first_token_delays_s.append(time.monotonic() - self._queued_at)

    async def next_token(self, count: int = 1) -> None:
        """Wait until the engine has produced `count` more of this sequence's tokens."""
        self._produced += count
        await self._engine.next_token(self._key, self._produced, count)


class Engine:
    def __init__(
        self, profile: Callable[[], SimProfile], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._profile = profile
        self._clock = clock
        p = profile()
        self._rng = random.Random(p.seed)
        self.counters = Counters()
        self._keys = itertools.count()
        self._cold = ColdLoad(last_seen=clock(), ready_at=clock())
        self._replica = Replica(engine_spec(p))
        self._spec_of: SimProfile = p
        self._admitted: dict[int, float] = {}  # key -> when it was handed over
        self._prefixes = PrefixCache(p.prefix_cache_tokens, p.prefix_block_tokens)
        self._running: set[int] = set()
        self._firsts: set[int] = set()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_version = -1
        self._model_at = 0.0  # model seconds at real `_real_at`: the replica's clock
        self._real_at = time.monotonic()

    @property
    def rng(self) -> random.Random:
        return self._rng

    @asynccontextmanager
    async def sequence(self, input_tokens: int, prompt: bytes = b"") -> AsyncIterator[EngineSequence]:
        c, p = self.counters, self._profile()
        key = next(self._keys)
        queued_at = time.monotonic()
        if p.kind is Kind.SERVERLESS:
            c.running += 1
            c.max_running = max(c.max_running, c.running)
            c.max_in_flight = max(c.max_in_flight, c.in_flight)
            c.queue_waits_s.append(0.0)
            self._running.add(key)
        else:
            c.queued += 1
            c.max_in_flight = max(c.max_in_flight, c.in_flight)
            self._admitted[key] = queued_at
            cached = self._prefix_cache(p).cached_tokens(prompt, max(1, input_tokens))
            c.prefix_hit_tokens += cached
            c.prefill_tokens += max(1, input_tokens) - cached
            self._call(lambda now: self._replica.submit(now, key, max(1, input_tokens), cached_tokens=cached))
        try:
            yield EngineSequence(self, key, input_tokens, queued_at)
            c.completed += 1
            c.completed_prompt_tokens += input_tokens
        except BaseException:
            c.cancelled += 1
            raise
        finally:
            self._release(key)

    def _prefix_cache(self, p: SimProfile) -> PrefixCache:
        """The replica's prefix cache, made anew (empty) when PUT /sim/config resizes it."""
        wanted = (p.prefix_cache_tokens, p.prefix_block_tokens)
        if (self._prefixes.capacity_tokens, self._prefixes.block_tokens) != wanted:
            self._prefixes = PrefixCache(*wanted)
        return self._prefixes

    def count_request(self) -> None:
        self.counters.requests += 1

    def count_fault(self, name: str) -> None:
        self.counters.faults[name] = self.counters.faults.get(name, 0) + 1

    async def first_token(self, key: int, input_tokens: int) -> None:
        p = self._profile()
        if p.kind is Kind.SERVERLESS:
            await asyncio.sleep(self.serverless_ttft_s())
            return
        if key not in self._firsts:
            await self._wait(key, lambda now: None)
        await asyncio.sleep(p.delay(p.overhead_s))

    async def next_token(self, key: int, produced: int, count: int) -> None:
        p = self._profile()
        if p.kind is Kind.SERVERLESS:
            await asyncio.sleep(p.delay(p.serverless_itl_s) * count)
            return
        await self._wait(key, lambda now: self._replica.watch(now, key, produced))

    # the replica on the loop's clock ------------------------------------------------------------

    def _model_now(self) -> float:
        p = self._profile()
        return self._model_at + (time.monotonic() - self._real_at) * p.time_scale / p.slowdown

    def _call(self, change: Callable[[float], None]) -> None:
        """Apply a change to the replica at the model's now, then act on what it reports."""
        now = self._model_now()
        self._model_at, self._real_at = now, time.monotonic()
        p = self._profile()
        if p is not self._spec_of:  # PUT /sim/config: the next steps run on the new figures
            self._spec_of = p
            self._replica.spec = engine_spec(p)
        change(now)
        self._settle()

    async def _wait(self, key: int, change: Callable[[float], None]) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[key] = future
        self._call(change)
        try:
            await future
        finally:
            if self._waiters.get(key) is future:
                del self._waiters[key]

    def _settle(self) -> None:
        c = self.counters
        for kind, key in self._replica.drain():
            if kind == "admitted" and key in self._admitted:
                c.queued -= 1
                c.running += 1
                c.max_running = max(c.max_running, c.running)
                self._running.add(key)
                c.queue_waits_s.append(time.monotonic() - self._admitted.pop(key))
            elif kind in ("first", "token"):
                if kind == "first":
                    self._firsts.add(key)
                future = self._waiters.pop(key, None)
                if future is not None and not future.done():
                    future.set_result(None)
        self._arm()

    def _arm(self) -> None:
        replica = self._replica
        if replica.version == self._timer_version:
            return
        self._timer_version = replica.version
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if replica.step_end_at < math.inf:
            p = self._profile()
            real = self._real_at + (replica.step_end_at - self._model_at) * p.slowdown / p.time_scale
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + max(0.0, real - time.monotonic()), self._step_ended)

    def _step_ended(self) -> None:
        self._timer = None
        at = self._replica.step_end_at
        self._model_at, self._real_at = at, time.monotonic()
        self._replica.end_step(at)
        self._timer_version = -1
        self._settle()

    def _release(self, key: int) -> None:
        c = self.counters
        self._firsts.discard(key)
        if key in self._running:
            self._running.discard(key)
            c.running -= 1
        elif self._admitted.pop(key, None) is not None:
            c.queued -= 1
        if self._profile().kind is not Kind.SERVERLESS:
            self._call(lambda now: self._replica.release(now, key))

    def serverless_ttft_s(self) -> float:
        """The real seconds a serverless request waits for its first token."""
        p = self._profile()
        return p.delay(self._serverless_ttft(p))

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


def engine_spec(p: SimProfile) -> EngineSpec:
    """The profile's dedicated figures as the shared engine's."""
    return EngineSpec(
        step_fixed_s=p.itl_s,
        step_per_seq_s=p.itl_per_seq_s,
        step_per_prompt_token_s=1.0 / p.prefill_tokens_per_s,
        decode_tokens_per_s=p.decode_tokens_per_s,
        max_num_seqs=p.max_concurrency,
        max_num_batched_tokens=p.max_num_batched_tokens,
        kv_capacity_tokens=p.kv_capacity_tokens,
    )
