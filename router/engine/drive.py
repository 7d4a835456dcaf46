"""Drive one replica over a list of requests in model time: what the published-figure checks
(tests/router/test_engine_published.py, docs/simulator.md) and the planner's unit tests run.
Each request arrives at its time, or, in a closed loop, when one of `concurrency` clients has
its previous answer (as `vllm bench serve --max-concurrency` and NIM's sweeps send them)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from router.engine.replica import Replica
from router.engine.spec import EngineSpec


@dataclass(frozen=True, slots=True)
class Job:
    prompt_tokens: int
    output_tokens: int
    at_s: float = 0.0


@dataclass(slots=True)
class Timing:
    arrived_s: float = math.nan
    first_s: float = math.nan
    done_s: float = math.nan

    @property
    def ttft_s(self) -> float:
        return self.first_s - self.arrived_s

    def itl_s(self, output_tokens: int) -> float:
        """The mean gap between this answer's tokens after the first."""
        return (self.done_s - self.first_s) / max(1, output_tokens - 1)


def replay(spec: EngineSpec, jobs: Sequence[Job], concurrency: int | None = None) -> list[Timing]:
    """Each job's arrival, first token and last token, in model seconds from 0."""
    replica = Replica(spec)
    timings = [Timing() for _ in jobs]
    arrivals: list[tuple[float, int]] = []
    if concurrency is None:
        arrivals = sorted((job.at_s, i) for i, job in enumerate(jobs))
    else:
        arrivals = [(0.0, i) for i in range(min(concurrency, len(jobs)))]
    heapq.heapify(arrivals)
    following = iter(range(len(arrivals), len(jobs)) if concurrency is not None else ())
    while arrivals or replica.step_end_at < math.inf:
        if arrivals and arrivals[0][0] <= replica.step_end_at:
            now, index = heapq.heappop(arrivals)
            timings[index].arrived_s = now
            job = jobs[index]
            replica.submit(now, index, job.prompt_tokens, job.output_tokens)
            continue
        now = replica.step_end_at
        replica.end_step(now)
        for kind, index in replica.drain():
            if kind == "first":
                timings[index].first_s = now
            elif kind == "done":
                timings[index].done_s = now
                replica.release(now, index)
                following_index = next(following, None)
                if following_index is not None:
                    heapq.heappush(arrivals, (now, following_index))
    return timings
