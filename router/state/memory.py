"""The embedded store: one process, one event loop, no I/O. The default without Redis."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from policies.types import Snapshot
from router.periodic import every
from router.state.base import Lease, Slots, probe_order
from router.state.latency import (
    CountBook,
    Counts,
    Histogram,
    LatencyBook,
    Metric,
    figures_by_route,
    resolution_for,
)
from router.tasks import EarlyBound, Feedback, FeedbackResult, Settlement, TaskState

V = TypeVar("V")
_REFRESH_S = 1.0
_MAX_KEEP_S = 3600.0  # in-process history is bounded: an hour of slices at most


class MemoryStore:
    """Slots are plain counters, atomic because the event loop runs one task at a time.
    Waiters queue FIFO per pool; a release hands the slot straight to the first in line."""

    name = "memory"
    degraded = False  # nothing to lose contact with
    fallback_admissions = 0

    def __init__(
        self,
        routes: Sequence[str] = (),
        *,
        window_s: float = 60.0,
        retention_s: float = 3600.0,
        max_tasks: int = 200_000,
    ) -> None:
        # task id -> (state, expiry) and request id -> (task id, expiry), oldest first, each
        # at most `max_tasks` long (the oldest entry is dropped first)
        self._tasks: OrderedDict[str, tuple[TaskState, float]] = OrderedDict()
        self._requests: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._max_tasks = max_tasks
        # failure feedback on a task (or request) not settled yet: name -> (caller, until),
        # oldest first, apart from the tasks so that it can never push one out
        self._early: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._early_by: Counter[str] = Counter()
        self._spent: dict[str, tuple[float, float]] = {}  # spend ledger -> (usd, expiry)
        self._probes: dict[str, bytes] = {}  # model -> the applied probe ranking (JSON)
        self._leaders: dict[str, tuple[str, float]] = {}  # role -> (token, until)
        self._runs: dict[str, tuple[int, bytes | None]] = {}  # model -> (version, run JSON)
        self._history: dict[str, deque[bytes]] = {}
        self._held: defaultdict[str, dict[str, int]] = defaultdict(dict)  # pool -> token -> weight
        self._prefill_samples: dict[str, deque[tuple[float, float]]] = {}
        self._used: defaultdict[str, int] = defaultdict(int)  # pool -> slots held
        self._capacity: dict[str, int] = {}
        self._pending: defaultdict[str, dict[str, int]] = defaultdict(dict)  # pool -> token -> tokens
        self._pending_sum: defaultdict[str, int] = defaultdict(int)
        self._queues: defaultdict[str, deque[tuple[asyncio.Future[Lease], int, int]]] = defaultdict(deque)
        self._tokens = itertools.count()
        self._canary: dict[str, float] = {}
        self._circuits: dict[str, tuple[float, int]] = {}  # route -> (cooldown end, trips)
        self._book = LatencyBook()
        self._counts = CountBook()
        self._keep_s = min(max(retention_s, window_s), _MAX_KEEP_S)
        self._routes = tuple(routes)
        self._window_s = window_s
        self._figures = Snapshot(now=0.0)
        self._task: asyncio.Task[None] | None = None

    async def try_acquire(self, pool: str, slots: Slots, wait_s: float = 0.0) -> Lease | None:
        self._capacity[pool] = slots.capacity
        queue = self._queues[pool]
        if self._used[pool] + slots.weight <= slots.capacity and not queue:
            if not self._prefill_fits(pool, slots):
                return None
            return self._grant(pool, slots.weight, slots.prompt_tokens)
        if wait_s <= 0 or len(queue) >= slots.max_waiters:
            return None
        waiter: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        entry = (waiter, slots.weight, slots.prompt_tokens)
        queue.append(entry)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), wait_s)
        except TimeoutError:
            return waiter.result() if waiter.done() else None  # granted right at the deadline
        except asyncio.CancelledError:
            if waiter.done():
                self._release(waiter.result())
            raise
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(entry)
            waiter.cancel()

    def _prefill_fits(self, pool: str, slots: Slots) -> bool:
        pending = self._pending_sum[pool]
        limit = slots.max_pending_tokens
        return limit is None or pending == 0 or pending + slots.prompt_tokens <= limit

    def _grant(self, pool: str, weight: int, prompt_tokens: int = 0) -> Lease:
        token = str(next(self._tokens))
        self._held[pool][token] = weight
        self._used[pool] += weight
        if prompt_tokens > 0:
            self._pending[pool][token] = prompt_tokens
            self._pending_sum[pool] += prompt_tokens
        return Lease(pool, token, weight, prompt_tokens, self._pending_sum[pool])

    async def prefilled(self, lease: Lease) -> None:
        self._forget_pending(lease)

    async def prefill_samples(
        self, pool: str, new: Sequence[tuple[float, float]], keep: int
    ) -> list[tuple[float, float]]:
        window = self._prefill_samples.get(pool)
        if window is None or window.maxlen != keep:
            window = self._prefill_samples[pool] = deque(window or (), maxlen=keep)
        window.extend(new)
        return list(window)

    def _forget_pending(self, lease: Lease) -> None:
        tokens = self._pending[lease.pool].pop(lease.token, None)
        if tokens is not None:
            self._pending_sum[lease.pool] -= tokens

    async def release(self, lease: Lease) -> None:
        self._release(lease)

    def _release(self, lease: Lease) -> None:
        self._forget_pending(lease)
        weight = self._held[lease.pool].pop(lease.token, None)
        if weight is None:
            return
        self._used[lease.pool] -= weight
        queue = self._queues[lease.pool]
        capacity = self._capacity.get(lease.pool, 0)
        while queue and self._used[lease.pool] + queue[0][1] <= capacity:  # FIFO: the head first
            waiter, wanted, prompt_tokens = queue.popleft()
            if not waiter.done():
                waiter.set_result(self._grant(lease.pool, wanted, prompt_tokens))

    def observe(self, route: str, metric: Metric, value_ms: float) -> None:
        self._book.observe(route, metric, value_ms, time.time())

    def count(self, route: str, counts: Mapping[str, float]) -> None:
        self._counts.add(route, counts, time.time())

    async def counts_window(self, routes: Sequence[str], window_s: float) -> dict[str, Counts]:
        wall = time.time()
        return {route: self._counts.window(route, wall, window_s) for route in routes}

    async def counts_series(
        self, routes: Sequence[str], window_s: float
    ) -> tuple[int, dict[str, list[tuple[int, Counts]]]]:
        wall = time.time()
        step = resolution_for(window_s)
        return step, {route: self._counts.series(route, wall, window_s, step) for route in routes}

    async def lead(self, token: str, ttl_s: float, role: str = "canary") -> bool:
        now = time.monotonic()
        holder, until = self._leaders.get(role, ("", 0.0))
        if holder in ("", token) or until < now:
            self._leaders[role] = (token, now + ttl_s)
            return True
        return False

    async def resign(self, token: str, role: str = "canary") -> None:
        if self._leaders.get(role, ("", 0.0))[0] == token:
            self._leaders[role] = ("", 0.0)

    async def canary_run(self, model: str) -> tuple[int, bytes | None]:
        return self._runs.get(model, (0, None))

    async def canary_history(self, model: str, limit: int) -> list[bytes]:
        return list(self._history.get(model, ()))[:limit]

    async def write_canary(
        self, model: str, run: bytes, event: bytes | None, *, version: int, leader: str | None, history: int
    ) -> int:
        holder, until = self._leaders.get("canary", ("", 0.0))
        if leader is not None and (holder != leader or until < time.monotonic()):
            return 0
        current, _ = self._runs.get(model, (0, None))
        if current != version:
            return -1
        self._runs[model] = (current + 1, run)
        if event is not None:
            events = self._history.setdefault(model, deque(maxlen=history))
            events.appendleft(event)
        return current + 1

    async def try_spend(self, ledger: str, usd: float, cap_usd: float, ttl_s: float) -> bool:
        now = time.monotonic()
        spent, until = self._spent.get(ledger, (0.0, now + ttl_s))
        if until < now:
            spent, until = 0.0, now + ttl_s
        if spent + usd > cap_usd:
            return False
        self._spent[ledger] = (spent + usd, until)
        return True

    async def settle_task(self, settled: Settlement, ttl_s: float) -> TaskState:
        task, request, route, ok, owner = (
            settled.task,
            settled.request,
            settled.route,
            settled.ok,
            settled.owner,
        )
        now = time.monotonic()
        marked = [self._take_early(name, owner, now) for name in {task, request}]
        before = self._live(self._tasks, task, now) or TaskState()
        before = replace(before, failed=before.failed or any(marked))
        state = TaskState(route, ok and not before.failed, before.failed, owner)
        self._keep(self._tasks, task, state, now + ttl_s)
        if task != request:
            self._keep(self._requests, request, task, now + ttl_s)
        return before

    async def task_feedback(
        self, key: str, ok: bool, caller: str | None, ttl_s: float, early: EarlyBound
    ) -> Feedback:
        now = time.monotonic()
        task = self._live(self._requests, key, now) or key
        before = self._live(self._tasks, task, now)
        if before is None:
            if ok or caller is None:
                return Feedback(task, TaskState(), FeedbackResult.IGNORED)
            return Feedback(task, TaskState(), self._keep_early(task, caller, now, early))
        if caller is not None and caller != before.owner:
            return Feedback(task, before, FeedbackResult.NOT_OWNER)
        if not ok:
            self._keep(self._tasks, task, replace(before, ok=False, failed=True), now + ttl_s)
        return Feedback(task, before, FeedbackResult.APPLIED)

    def _keep_early(self, name: str, caller: str, now: float, early: EarlyBound) -> FeedbackResult:
        while self._early and next(iter(self._early.values()))[1] < now:
            self._early_by[self._early.popitem(last=False)[1][0]] -= 1
        held = self._early.get(name)
        if held is not None and held[0] == caller:
            return FeedbackResult.KEPT
        if self._early_by[caller] >= early.max_per_caller:
            return FeedbackResult.TOO_EARLY
        if held is not None:
            self._early_by[held[0]] -= 1
        self._early[name] = (caller, now + early.keep_s)
        self._early.move_to_end(name)
        self._early_by[caller] += 1
        return FeedbackResult.KEPT

    def _take_early(self, name: str, owner: str, now: float) -> bool:
        """Whether `owner`'s early failure feedback on `name` was waiting (it is used up)."""
        held = self._early.pop(name, None)
        if held is None:
            return False
        self._early_by[held[0]] -= 1
        return held[0] == owner and held[1] >= now

    def _live(self, entries: OrderedDict[str, tuple[V, float]], key: str, now: float) -> V | None:
        entry = entries.get(key)
        if entry is None or entry[1] < now:
            return None
        return entry[0]

    def _keep(self, entries: OrderedDict[str, tuple[V, float]], key: str, value: V, expires: float) -> None:
        entries[key] = (value, expires)
        entries.move_to_end(key)
        while len(entries) > self._max_tasks:
            entries.popitem(last=False)

    async def latency_window(
        self, routes: Sequence[str], metric: Metric, window_s: float
    ) -> dict[str, Histogram]:
        wall = time.time()
        return {route: self._book.window(route, metric, wall, window_s) for route in routes}

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=time.monotonic(),
            in_flight=dict(self._used),
            waiting={pool: len(queue) for pool, queue in self._queues.items()},
            pending_prompt_tokens=dict(self._pending_sum),
            canary_percent=dict(self._canary),
            circuit_open={route: until for route, (until, _) in self._circuits.items()},
            ttft=self._figures.ttft,
            e2e=self._figures.e2e,
            probe_order={model: probe_order(raw) for model, raw in self._probes.items()},
        )

    async def set_probe(self, model: str, ranking: bytes) -> None:
        self._probes[model] = ranking

    async def probe(self, model: str) -> bytes | None:
        return self._probes.get(model)

    async def refresh(self) -> None:
        """Recompute the windowed figures and drop slices older than the window."""
        wall = time.time()
        self._book.forget_before(wall - self._keep_s - 60)
        self._counts.forget_before(wall - self._keep_s - 60)
        ttft = await self.latency_window(self._routes, Metric.TTFT, self._window_s)
        e2e = await self.latency_window(self._routes, Metric.E2E, self._window_s)
        self._figures = Snapshot(
            now=time.monotonic(), ttft=figures_by_route(ttft.items()), e2e=figures_by_route(e2e.items())
        )

    async def set_canary(self, model: str, percent: float) -> None:
        self._canary[model] = percent

    async def trip(self, route: str, cooldown_s: float, max_cooldown_s: float) -> float:
        now = time.monotonic()
        until, trips = self._circuits.get(route, (now, 0))
        trips += 1
        until = max(until, now + min(max_cooldown_s, cooldown_s * 2.0 ** (trips - 1)))
        self._circuits[route] = (until, trips)
        return until - now

    async def reset_circuit(self, route: str) -> None:
        self._circuits.pop(route, None)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(every(_REFRESH_S, self.refresh))

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._held.clear()
        self._used.clear()
