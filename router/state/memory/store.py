"""The embedded store: one process, one event loop, no I/O. The default without Redis. It is
its roles composed (router/state/roles.py): leases, series, control, tasks, each a module of
this folder, as the Redis store's are (router/state/redis/)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from policies.types import Snapshot
from router.periodic import Loops
from router.state.memory.control import MemoryControl
from router.state.memory.leases import MemoryLeases
from router.state.memory.series import MemorySeries
from router.state.memory.tasks import MemoryTasks
from router.state.quota import MemoryQuotas
from router.state.rankings import diverging, probe_order

_REFRESH_S = 1.0


class MemoryStore(MemoryLeases, MemorySeries, MemoryControl, MemoryTasks, MemoryQuotas):
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
        MemoryLeases.__init__(self)
        MemorySeries.__init__(self, routes, window_s, retention_s)
        MemoryControl.__init__(self)
        MemoryTasks.__init__(self, max_tasks)
        MemoryQuotas.__init__(self)
        self._task: asyncio.Task[None] | None = None

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=time.monotonic(),
            in_flight=self.in_flight(),
            waiting=self.waiting(),
            pending_prompt_tokens=self.pending_prompt_tokens(),
            canary_percent=dict(self._canary),
            circuit_open={route: until for route, (until, _) in self._circuits.items()},
            ttft=self._figures.ttft,
            e2e=self._figures.e2e,
            probe_order={model: probe_order(raw) for model, raw in self._probes.items()},
            parity_diverges={model: diverging(raw) for model, raw in self._parity.items()},
        )

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.loops.every("store refresh", _REFRESH_S, self.refresh)
            )

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.forget_leases()
