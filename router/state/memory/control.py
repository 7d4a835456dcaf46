"""The control plane in one process, a role class each: circuits, leader leases, canary runs and
percents, applied probe rankings and parity verdicts, spend ledgers. Those that feed the
snapshot give their fields (`snapshot_fields`), as the Redis store's feeds do."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from router.state.rankings import diverging, probe_order


class MemoryCircuits:
    """The snapshot's fields here and below are replaced on a write, never changed in place, so
    a snapshot (one a request) shares them rather than copying them."""

    def __init__(self) -> None:
        self._open: dict[str, float] = {}  # route -> cooldown end
        self._trips: dict[str, int] = {}  # route -> trips since it last closed

    async def trip(self, route: str, cooldown_s: float, max_cooldown_s: float) -> float:
        now = time.monotonic()
        trips = self._trips.get(route, 0) + 1
        until = max(self._open.get(route, now), now + min(max_cooldown_s, cooldown_s * 2.0 ** (trips - 1)))
        self._trips[route] = trips
        self._open = {**self._open, route: until}
        return until - now

    async def reset_circuit(self, route: str) -> None:
        self._trips.pop(route, None)
        self._open = {r: until for r, until in self._open.items() if r != route}

    def snapshot_fields(self) -> dict[str, Any]:
        return {"circuit_open": self._open}


class MemoryLeadership:
    def __init__(self) -> None:
        self._leaders: dict[str, tuple[str, float]] = {}  # role -> (token, until)

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

    def holds(self, token: str, role: str) -> bool:
        holder, until = self._leaders.get(role, ("", 0.0))
        return holder == token and until >= time.monotonic()


class MemoryCanaryRuns:
    """Canary runs are fenced by the canary leader lease, as the Redis script fences them."""

    def __init__(self, leadership: MemoryLeadership) -> None:
        self._leadership = leadership
        self._runs: dict[str, tuple[int, bytes | None]] = {}  # model -> (version, run JSON)
        self._history: dict[str, deque[bytes]] = {}
        self._canary: dict[str, float] = {}

    async def canary_run(self, model: str) -> tuple[int, bytes | None]:
        return self._runs.get(model, (0, None))

    async def canary_history(self, model: str, limit: int) -> list[bytes]:
        return list(self._history.get(model, ()))[:limit]

    async def write_canary(
        self, model: str, run: bytes, event: bytes | None, *, version: int, leader: str | None, history: int
    ) -> int:
        if leader is not None and not self._leadership.holds(leader, "canary"):
            return 0
        current, _ = self._runs.get(model, (0, None))
        if current != version:
            return -1
        self._runs[model] = (current + 1, run)
        if event is not None:
            events = self._history.setdefault(model, deque(maxlen=history))
            events.appendleft(event)
        return current + 1

    async def set_canary(self, model: str, percent: float) -> None:
        self._canary = {**self._canary, model: percent}

    async def clear_canary(self, model: str) -> None:
        self._canary = {m: p for m, p in self._canary.items() if m != model}

    async def live_canary(self, model: str) -> float | None:
        return self._canary.get(model)

    def snapshot_fields(self) -> dict[str, Any]:
        return {"canary_percent": self._canary}


class MemoryRankings:
    def __init__(self) -> None:
        self._probes: dict[str, bytes] = {}  # model -> the applied probe ranking (JSON)
        self._parity: dict[str, bytes] = {}  # model -> the applied parity verdicts (JSON)
        self._orders: dict[str, tuple[str, ...]] = {}  # read once, when applied
        self._diverging: dict[str, frozenset[str]] = {}

    async def set_probe(self, model: str, ranking: bytes) -> None:
        self._probes[model] = ranking
        self._orders = {**self._orders, model: probe_order(ranking)}

    async def probe(self, model: str) -> bytes | None:
        return self._probes.get(model)

    async def set_parity(self, model: str, verdicts: bytes) -> None:
        self._parity[model] = verdicts
        self._diverging = {**self._diverging, model: diverging(verdicts)}

    async def parity(self, model: str) -> bytes | None:
        return self._parity.get(model)

    def snapshot_fields(self) -> dict[str, Any]:
        return {"probe_order": self._orders, "parity_diverges": self._diverging}


class MemorySpend:
    def __init__(self) -> None:
        self._spent: dict[str, tuple[float, float]] = {}  # spend ledger -> (usd, expiry)

    async def try_spend(self, ledger: str, usd: float, cap_usd: float, ttl_s: float) -> bool:
        now = time.monotonic()
        spent, until = self._spent.get(ledger, (0.0, now + ttl_s))
        if until < now:
            spent, until = 0.0, now + ttl_s
        if spent + usd > cap_usd:
            return False
        self._spent[ledger] = (spent + usd, until)
        return True

    async def settle_spend(self, ledger: str, delta_usd: float) -> None:
        found = self._spent.get(ledger)
        if found is not None and found[1] >= time.monotonic():
            self._spent[ledger] = (max(0.0, found[0] + delta_usd), found[1])
