"""A discrete-event model of tidegate in front of dedicated replicas and one serverless route:
what `tidegate plan` runs instead of HTTP, minutes of trace in a fraction of a second.

It models the same system `tidegate replay` measures, piece by piece:
- **a dedicated replica** as the simulator runs one: the shared-step vLLM V1 engine
  (router/engine/replica.py), where prompt chunks and decode tokens share each step, at most
  `max_num_seqs` run and the KV cache holds what runs; plus a fixed `overhead_s` to the first
  token. Runs of alike decode steps are one event, so an arrival, a prefill step or a finish
  costs O(log n), not one event per token;
- **serverless** as the simulator runs it: TTFT drawn from the calibration's distribution, plus
  a cold load when the route was idle longer than `idle_to_cold_s` (every request arriving
  during the load waits for its end: tidegate/offline/calibration.py `ColdLoad`), then a fixed
  inter-token latency; no slots;
- **tidegate's routing** (policies/canary.py, policies/dedicated_first.py, the store's slots):
  a request outside the canary share goes to serverless; otherwise to the first replica with
  a free slot (`max_concurrency` per replica); with every slot taken it waits in line on the
  first replica for up to `max_queue_ms` when the expected wait (waiting + 1 mean service times
  per slot) beats the serverless route's windowed p95 TTFT, and spills when the wait runs out;
  otherwise it spills at once.
Times are in trace seconds. The output is one record per request, in the form
`tidegate replay` writes, so both are summarised by the same code (tidegate/offline/replay.py).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.engine.replica import Replica
from tidegate.offline.calibration import ColdLoad
from tidegate.offline.planner.plans import SERVERLESS_ROUTE, Plan, System, dedicated_route, keep_warm_times
from tidegate.offline.replay import Arrival
from tidegate.offline.stats import TimeWindow


@dataclass(slots=True)
class _Request:
    index: int
    arrival: Arrival
    route: str = ""
    reason: str = ""
    first_token_at: float = 0.0
    done_at: float = 0.0
    waiting: bool = False
    batch: bool = False
    admitted_at: float | None = None  # a batch request's slot, after its wait


@dataclass(slots=True)
class _Replica:
    index: int
    engine: Replica
    slots_used: int = 0
    pushed: int = -1  # the engine version whose step end is in the event heap
    pending_tokens: int = 0  # admitted, not yet at the first token (predicted-TTFT admission)


class _Run:
    """One plan over one trace; `records()` runs it."""

    def __init__(self, arrivals: Sequence[Arrival], plan: Plan, system: System, seed: int) -> None:
        self._plan = plan
        self._system = system
        self._rng = random.Random(seed)
        self._requests = [_Request(i, a) for i, a in enumerate(arrivals)]
        if system.batch_share > 0:  # which requests are batch: seeded, apart from the routing's draws
            picks = random.Random(seed + 1)
            for request in self._requests:
                request.batch = picks.random() < system.batch_share
        self._batch_waiters: deque[int] = deque()
        spec = system.dedicated.engine
        self._replicas = [_Replica(i, Replica(spec)) for i in range(plan.replicas)]
        self._events: list[tuple[float, int, str, int, int]] = []
        self._order = itertools.count()
        self._waiters: deque[int] = deque()  # requests waiting in line on the first replica
        self._cold = ColdLoad()
        self._longest_quiet_s = 0.0  # serverless's longest gap between requests (and pings)
        self._e2e_window = TimeWindow()  # first replica's completions
        self._ttft_window = TimeWindow()  # serverless first tokens
        # only a wait in line reads the windows (the expected wait against the spill's p95)
        self._windowed = bool(self._replicas) and plan.max_queue_ms > 0 and plan.ttft_budget_ms is None

    def records(self) -> list[dict[str, Any]]:
        order = self._order
        times = [r.arrival.at_s for r in self._requests]
        until = max(times, default=0.0)
        # the arrivals stay out of the heap, taken in time order (a trace is sorted; a stable sort
        # otherwise), which holds only the events the run makes (and the keep-warm pings, in
        # order: a valid heap as it stands); at equal times an arrival goes first, as it did when
        # arrivals were numbered before every event
        self._events = [(at, next(order), "warm", 0, 0) for at in keep_warm_times(self._plan, until)]
        handlers = {
            "step": self._step,
            "free": self._free,
            "timeout": self._timeout,
            "batch_timeout": self._batch_timeout,
            "warm": self._warm,
        }
        events, pop, arrive = self._events, heapq.heappop, self._arrive
        in_order = all(a <= b for a, b in itertools.pairwise(times))
        sequence = range(len(times)) if in_order else sorted(range(len(times)), key=times.__getitem__)
        next_arrival, count = 0, len(times)
        while True:
            if next_arrival < count and (not events or times[sequence[next_arrival]] <= events[0][0]):
                index = sequence[next_arrival]
                arrive(times[index], index, 0)
                next_arrival += 1
            elif events:
                now, _, kind, a, b = pop(events)
                handlers[kind](now, a, b)
            else:
                break
        self._longest_quiet_s = max(self._longest_quiet_s, until - self._cold.last_seen)
        return [self._record(r) for r in self._requests]

    @property
    def stayed_warm(self) -> bool:
        """Serverless never sat idle past its scale-to-zero gap, to the trace's end: no load
        started, so keep-warm pings would have changed nothing but their price."""
        idle_to_cold_s = self._system.serverless.idle_to_cold_s
        return idle_to_cold_s <= 0 or self._longest_quiet_s <= idle_to_cold_s

    def _push(self, at: float, kind: str, a: int, b: int = 0) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, a, b))

    # routing -------------------------------------------------------------------------------

    def _arrive(self, now: float, index: int, _: int) -> None:
        request = self._requests[index]
        plan = self._plan
        if not self._replicas:
            self._serverless(now, request, "serverless_only")
            return
        if request.batch:  # the canary does not hold batch work (routing.batch.canary: dedicated)
            self._arrive_batch(now, request)
            return
        if plan.canary_percent < 100 and self._rng.random() * 100 >= plan.canary_percent:
            self._serverless(now, request, "canary_out")
            return
        if plan.ttft_budget_ms is not None:
            self._predicted(now, request, plan.ttft_budget_ms)
            return
        for replica in self._replicas:
            if replica.slots_used < plan.max_concurrency:
                replica.slots_used += 1
                request.reason = "baseline"
                self._admit(now, replica, request)
                return
        if (
            plan.max_queue_ms > 0
            and self._worth_waiting(now)
            and len(self._waiters) < self._system.max_waiters
        ):
            request.waiting = True
            self._waiters.append(index)
            self._push(now + plan.max_queue_ms / 1000, "timeout", index)
            return
        self._serverless(now, request, "saturated")

    def _predicted(self, now: float, request: _Request, budget_ms: float) -> None:
        """policies/predicted_ttft.py with the calibration's own prefill figures (what the
        gateway's learner converges to): the first replica whose predicted TTFT fits the
        budget; else a spill at once."""
        d = self._system.dedicated
        tokens = request.arrival.input_tokens
        open_ = [r for r in self._replicas if r.slots_used < self._plan.max_concurrency]
        if not open_:
            self._serverless(now, request, "saturated")
            return
        for replica in open_:
            rate = replica.engine.prefill_rate()  # what the gateway's learned line converges to
            predicted_ms = 1000 * (d.overhead_s + (replica.pending_tokens + tokens) / rate)
            if predicted_ms <= budget_ms:
                self._take(now, replica, request)
                return
        self._serverless(now, request, "predicted_slow")

    def _take(self, now: float, replica: _Replica, request: _Request) -> None:
        replica.slots_used += 1
        replica.pending_tokens += request.arrival.input_tokens
        request.reason = "baseline"
        self._admit(now, replica, request)

    def _worth_waiting(self, now: float) -> bool:
        """policies.dedicated_first.worth_waiting_ms over the windowed figures."""
        horizon = now - self._system.window_s
        for window in (self._e2e_window, self._ttft_window):
            window.drop_before(horizon)
        if not self._e2e_window or not self._ttft_window:
            return True  # unknown figures: the bound alone decides
        mean_e2e_ms = 1000 * self._e2e_window.mean()
        expected_ms = (len(self._waiters) + 1) * mean_e2e_ms / self._plan.max_concurrency
        if expected_ms >= self._plan.max_queue_ms:
            return False  # the bound alone says no: the percentile is not needed
        return expected_ms < 1000 * self._ttft_window.percentile(95)

    def _timeout(self, now: float, index: int, _: int) -> None:
        request = self._requests[index]
        if request.waiting:
            request.waiting = False
            self._waiters.remove(index)
            self._serverless(now, request, "saturated")

    def _release_slot(self, now: float, replica: _Replica) -> None:
        replica.slots_used -= 1
        if replica.index == 0 and self._waiters:  # FIFO: the head of the line gets the slot
            index = self._waiters.popleft()
            waiter = self._requests[index]
            waiter.waiting = False
            replica.slots_used += 1
            waiter.reason = "baseline"
            self._admit(now, replica, waiter)
        elif self._batch_waiters and replica.slots_used < self._batch_cap():  # then batch's turn
            self._batch_take(now, replica, self._requests[self._batch_waiters.popleft()])

    # batch -----------------------------------------------------------------------------------

    def _batch_cap(self) -> int:
        """The slots batch may hold per replica: the pool less its reserve (at most all but one)."""
        size = self._plan.max_concurrency
        return size - min(self._system.batch_reserve, size - 1)

    def _arrive_batch(self, now: float, request: _Request) -> None:
        if not self._waiters:  # an interactive request in line comes first
            for replica in self._replicas:
                if replica.slots_used < self._batch_cap():
                    self._batch_take(now, replica, request)
                    return
        request.waiting = True
        self._batch_waiters.append(request.index)
        self._push(now + self._system.batch_max_wait_s, "batch_timeout", request.index)

    def _batch_take(self, now: float, replica: _Replica, request: _Request) -> None:
        request.waiting = False
        request.admitted_at = now
        replica.slots_used += 1
        request.reason = "batch"
        self._admit(now, replica, request)

    def _batch_timeout(self, now: float, index: int, _: int) -> None:
        request = self._requests[index]
        if request.waiting:  # refused after its wait (503): no route, no answer
            request.waiting = False
            self._batch_waiters.remove(index)
            request.reason, request.first_token_at = "batch_timeout", now

    # serverless ----------------------------------------------------------------------------

    def _warm(self, now: float, _: int, __: int) -> None:
        """A keep-warm ping: the provider saw a request (its own cold start, if any, is the
        ping's, and pings are not latency samples)."""
        self._cold_wait(now)

    def _cold_wait(self, now: float) -> float:
        self._longest_quiet_s = max(self._longest_quiet_s, now - self._cold.last_seen)
        return self._cold.wait_s(now, self._system.serverless.idle_to_cold_s, self._load_s)

    def _load_s(self) -> float:
        return self._rng.uniform(*self._system.serverless.ttft.cold_range_s)

    def _serverless(self, now: float, request: _Request, reason: str) -> None:
        s = self._system.serverless
        ttft = s.ttft.sample(self._rng)
        if s.idle_to_cold_s > 0 or self._cold.ready_at > now:  # a scale-to-zero route's load
            ttft += self._cold_wait(now)
        request.route, request.reason = SERVERLESS_ROUTE, reason
        first = request.first_token_at = now + ttft
        request.done_at = first + (request.arrival.output_tokens - 1) * s.itl_s
        if self._windowed:  # kept to its span as it grows
            window = self._ttft_window
            window.drop_before(now - self._system.window_s)
            window.append(first, ttft)

    # a dedicated replica ---------------------------------------------------------------------

    def _admit(self, now: float, replica: _Replica, request: _Request) -> None:
        request.route = dedicated_route(replica.index)
        arrival = request.arrival
        cached = int(arrival.input_tokens * self._system.prefix_hit_rate)
        replica.engine.submit(
            now, request.index, arrival.input_tokens, max(1, arrival.output_tokens), cached_tokens=cached
        )
        self._sync(replica)

    def _sync(self, replica: _Replica) -> None:
        """Schedule the end of the replica's step in progress, whenever it changed."""
        engine = replica.engine
        if engine.version != replica.pushed:
            replica.pushed = engine.version
            if engine.step_end_at < math.inf:
                self._push(engine.step_end_at, "step", replica.index, engine.version)

    def _step(self, now: float, replica_index: int, version: int) -> None:
        replica = self._replicas[replica_index]
        engine = replica.engine
        if version != engine.version:
            return  # the step was cut short since this was scheduled
        engine.end_step(now)
        for kind, index in engine.drain():
            request = self._requests[index]
            if kind == "first":
                request.first_token_at = now + self._system.dedicated.overhead_s
                if self._plan.ttft_budget_ms is not None:
                    replica.pending_tokens -= request.arrival.input_tokens
            elif kind == "done":
                self._finish(now, replica, request)
        self._sync(replica)

    def _finish(self, now: float, replica: _Replica, request: _Request) -> None:
        # the gateway sees every token `overhead_s` after the GPU made it (the first one too),
        # and holds the slot until the last one has reached it
        request.done_at = now + self._system.dedicated.overhead_s
        self._push(request.done_at, "free", replica.index, request.index)

    def _free(self, now: float, replica_index: int, index: int) -> None:
        replica = self._replicas[replica_index]
        if replica.index == 0 and self._windowed:
            self._e2e_window.drop_before(now - self._system.window_s)
            self._e2e_window.append(now, now - self._requests[index].arrival.at_s)
        self._release_slot(now, replica)

    def _record(self, r: _Request) -> dict[str, Any]:
        overhead = self._system.gateway_overhead_s
        if r.reason == "batch_timeout":
            return {
                "index": r.index,
                "at_s": r.arrival.at_s,
                "input_tokens": r.arrival.input_tokens,
                "output_tokens": 0,
                "sent": True,
                "ok": False,
                "route": None,
                "reason": r.reason,
                "ttft_ms": None,
                "e2e_ms": None,
                "lag_ms": 0.0,
                "batch": True,
            }
        found = {
            "batch": r.batch,
            "index": r.index,
            "at_s": r.arrival.at_s,
            "input_tokens": r.arrival.input_tokens,
            "output_tokens": r.arrival.output_tokens,
            "sent": True,
            "ok": True,
            "route": r.route,
            "reason": r.reason,
            "ttft_ms": (r.first_token_at - r.arrival.at_s + overhead) * 1000,
            "e2e_ms": (r.done_at - r.arrival.at_s + overhead) * 1000,
            "lag_ms": 0.0,
        }
        if r.admitted_at is not None:  # the slot was held from then, not from the arrival
            found["admitted_s"] = r.admitted_at
        return found


def simulate(arrivals: Sequence[Arrival], plan: Plan, system: System, seed: int = 0) -> list[dict[str, Any]]:
    """One record per arrival (the form `tidegate replay` writes), from the model."""
    return _Run(arrivals, plan, system, seed).records()


def simulate_keep_warm(
    arrivals: Sequence[Arrival], plans: Sequence[Plan], system: System, seed: int = 0
) -> list[list[dict[str, Any]]]:
    """`simulate` for each of `plans`, which differ only in `keep_warm_s` (the first without
    pings), in one run where that is exact: when the plan without pings never left serverless
    idle past its scale-to-zero gap, pings start no load and move no random draw, so every
    variant's records are the same list (read it, do not change it). Else each runs."""
    if not plans:
        return []
    first = _Run(arrivals, plans[0], system, seed)
    records = first.records()
    if plans[0].keep_warm_s <= 0 and first.stayed_warm:
        return [records] * len(plans)
    return [records, *(simulate(arrivals, plan, system, seed) for plan in plans[1:])]


def keep_warm_groups(plans: Sequence[Plan]) -> list[list[int]]:
    """The plans' indices in groups alike but for `keep_warm_s`, in order of first appearance,
    each led by its plan without pings when there is one (what `simulate_keep_warm` takes)."""
    groups: dict[Plan, list[int]] = {}
    for index, plan in enumerate(plans):
        groups.setdefault(dataclasses.replace(plan, keep_warm_s=0.0), []).append(index)
    return [sorted(group, key=lambda i: plans[i].keep_warm_s > 0) for group in groups.values()]
