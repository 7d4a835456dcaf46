"""The embedded store: one process, one event loop, no I/O. The default without Redis. One role
object each (router/state/roles.py), as the Redis store's (router/state/redis/store.py):
leases, series, circuits, leadership, canary runs, rankings, spend, tasks, quotas, members. The roles
that feed the snapshot give their own fields; `snapshot()` joins them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from policies.types import Snapshot
from router.periodic import Loops
from router.state.memory.control import (
    MemoryCanaryRuns,
    MemoryCircuits,
    MemoryLeadership,
    MemoryRankings,
    MemorySpend,
)
from router.state.memory.leases import MemoryLeases
from router.state.memory.members import MemoryMembers
from router.state.memory.series import MemorySeries
from router.state.memory.tasks import MemoryTasks
from router.state.quota import MemoryQuotas

_REFRESH_S = 1.0


class MemoryStore:
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
        loops: Loops | None = None,
    ) -> None:
        self.loops = loops or Loops()
        self.started_at = time.time()  # the gateway (one process) exists from here: reports bill from it
        self.leases = MemoryLeases()
        self.series = MemorySeries(routes, window_s, retention_s)
        self.circuits = MemoryCircuits()
        self.leadership = MemoryLeadership()
        self.canary = MemoryCanaryRuns(self.leadership)
        self.rankings = MemoryRankings()
        self.spend = MemorySpend()
        self.tasks = MemoryTasks(max_tasks)
        self.quotas = MemoryQuotas()
        self.members = MemoryMembers()
        self._task: asyncio.Task[None] | None = None

    def snapshot(self) -> Snapshot:
        return Snapshot(  # one merge of the feeding roles' fields, built in C (every request's)
            now=time.monotonic(),
            **self.leases.snapshot_fields(),
            **self.series.snapshot_fields(),
            **self.circuits.snapshot_fields(),
            **self.canary.snapshot_fields(),
            **self.rankings.snapshot_fields(),
        )

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.loops.every("store refresh", _REFRESH_S, self.series.refresh)
            )

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.leases.forget_leases()
