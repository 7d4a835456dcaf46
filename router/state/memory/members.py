"""DNS pools' slot sets in one process (router/state/roles.py, `Members`)."""

from __future__ import annotations

import time

from router.state.members import Assignment, Sighting, assign


class MemoryMembers:
    def __init__(self) -> None:
        self._pools: dict[str, Assignment] = {}

    async def claim(self, sighting: Sighting) -> dict[int, str]:
        before = self._pools.get(sighting.pool, Assignment({}, {}))
        after = self._pools[sighting.pool] = assign(before, sighting, time.monotonic())
        return dict(after.held)
