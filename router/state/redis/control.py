"""The control plane in Redis, a role class each: circuits (shared breakers), leader leases
(the canary controller's, keep-warm's), canary runs and live percents, applied probe rankings
and parity verdicts, and spend ledgers. None of it is on the request path; every call that
cannot reach Redis raises StoreUnavailable, and what it changes reaches this process's snapshot
at once (the others' with their next refresh: the feeds' `read_refresh`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError, ResponseError

from router.errors import StoreUnavailable
from router.state.rankings import diverging, probe_order
from router.state.redis.link import Command, RedisRole, log
from router.state.redis.scripts import CANARY_WRITE, CIRCUITS, LEAD, RESIGN, SETTLE_SPEND, SPEND, TRIP


class RedisCircuits(RedisRole):
    """Shared breakers (roles.Circuits); the snapshot's open circuits."""

    async def trip(self, route: str, cooldown_s: float, max_cooldown_s: float) -> float:
        args = [int(cooldown_s * 1000), int(max_cooldown_s * 1000)]
        left_ms = int(
            await self._run(
                f"the circuit of {route} could not be opened", TRIP, [self._keys.breaker(route)], args
            )
        )
        circuits = {**self._link.snapshot.circuit_open, route: time.monotonic() + left_ms / 1000}
        self._link.publish(circuit_open=circuits)
        return left_ms / 1000

    async def reset_circuit(self, route: str) -> None:
        await self._ask(f"the circuit of {route} could not be closed", "DEL", self._keys.breaker(route))
        circuits = {k: v for k, v in self._link.snapshot.circuit_open.items() if k != route}
        self._link.publish(circuit_open=circuits)

    def refresh_commands(self) -> list[Command]:
        """The refresh's read of every route's circuit: the milliseconds its cooldown has left."""
        return [("EVAL", CIRCUITS, 1, self._keys.breaker(route)) for route in self._link.settings.routes]

    def read_refresh(self, answers: Sequence[Any]) -> dict[str, Any]:
        now, circuits = time.monotonic(), {}
        for route, answer in zip(self._link.settings.routes, answers, strict=True):
            left_ms = self._link.readings.value(f"the circuit of {route}", answer, _left_ms)
            if left_ms is not None:
                circuits[route] = now + left_ms / 1000
        return {"circuit_open": circuits}


class RedisLeadership(RedisRole):
    """Leader leases (roles.Leadership)."""

    async def lead(self, token: str, ttl_s: float, role: str = "canary") -> bool:
        key = self._keys.leader(role)
        return bool(
            await self._run("the leader lease could not be checked", LEAD, [key], [token, int(ttl_s * 1000)])
        )

    async def resign(self, token: str, role: str = "canary") -> None:
        with contextlib.suppress(RedisError):  # else the lease expires by itself
            await self._batch.call_script(RESIGN, [self._keys.leader(role)], [token])


class RedisCanaryRuns(RedisRole):
    """Canary runs, their history and the live percents (roles.CanaryRuns); the snapshot's percents."""

    def refresh_commands(self) -> list[Command]:
        return [("HGETALL", self._keys.canary_percent)]

    def read_refresh(self, answers: Sequence[Any]) -> dict[str, Any]:
        before = self._link.snapshot.canary_percent
        return {"canary_percent": self._link.readings.mapping("canary percents", answers[0], float, before)}

    async def canary_run(self, model: str) -> tuple[int, bytes | None]:
        key = self._keys.canary(model)[1]
        version, run = await self._ask("the canary run could not be read", "HMGET", key, "version", "json")
        return int(version or 0), run

    async def canary_history(self, model: str, limit: int) -> list[bytes]:
        key = self._keys.canary(model)[2]
        found = await self._ask("the canary history could not be read", "LRANGE", key, 0, limit - 1)
        return [e if isinstance(e, bytes) else str(e).encode() for e in found]

    async def write_canary(
        self, model: str, run: bytes, event: bytes | None, *, version: int, leader: str | None, history: int
    ) -> int:
        args: list[Any] = [leader or "", run, event or b"", history, version]
        return int(
            await self._run(
                "the canary run could not be written", CANARY_WRITE, self._keys.canary(model), args
            )
        )

    async def set_canary(self, model: str, percent: float) -> None:
        await self._ask(
            "the canary could not be stored", "HSET", self._keys.canary_percent, model, str(percent)
        )
        self._link.publish(canary_percent={**self._link.snapshot.canary_percent, model: percent})

    async def clear_canary(self, model: str) -> None:
        await self._ask("the canary could not be cleared", "HDEL", self._keys.canary_percent, model)
        percents = {m: p for m, p in self._link.snapshot.canary_percent.items() if m != model}
        self._link.publish(canary_percent=percents)

    async def live_canary(self, model: str) -> float | None:
        found = await self._ask("the canary could not be read", "HGET", self._keys.canary_percent, model)
        # an unreadable value is skipped as the refresh skips it: the file's percent is obeyed
        return None if found is None else self._link.readings.value(f"canary percent {model!r}", found, float)


class RedisRankings(RedisRole):
    """Applied probe rankings and parity verdicts (roles.Rankings); the snapshot's endpoint
    orders and diverging endpoints."""

    def refresh_commands(self) -> list[Command]:
        return [("HGETALL", self._keys.rankings), ("HGETALL", self._keys.parity)]

    def read_refresh(self, answers: Sequence[Any]) -> dict[str, Any]:
        read, shared = self._link.readings, self._link.snapshot
        return {
            "probe_order": read.mapping("probe rankings", answers[0], probe_order, shared.probe_order),
            "parity_diverges": read.mapping("parity verdicts", answers[1], diverging, shared.parity_diverges),
        }

    async def set_probe(self, model: str, ranking: bytes) -> None:
        await self._ask("the probe ranking could not be stored", "HSET", self._keys.rankings, model, ranking)
        self._link.publish(probe_order={**self._link.snapshot.probe_order, model: probe_order(ranking)})

    async def probe(self, model: str) -> bytes | None:
        return await self._applied("the probe ranking", self._keys.rankings, model)

    async def set_parity(self, model: str, verdicts: bytes) -> None:
        await self._ask("the parity verdicts could not be stored", "HSET", self._keys.parity, model, verdicts)
        found = {**self._link.snapshot.parity_diverges, model: diverging(verdicts)}
        self._link.publish(parity_diverges=found)

    async def parity(self, model: str) -> bytes | None:
        return await self._applied("the parity verdicts", self._keys.parity, model)

    async def _applied(self, what: str, key: str, model: str) -> bytes | None:
        """A model's entry of an applied-results hash. A key of the wrong type there (written
        by something else) reads as nothing applied, logged with the key to repair, as the
        refresh reads it: the admin views still answer."""
        try:
            found = await self._batch.call("HGET", key, model)
        except ResponseError as exc:
            log.warning(
                "state store: %s of %s cannot be read from %s (%s); DEL it to repair", what, model, key, exc
            )
            return None
        except RedisError as exc:
            raise StoreUnavailable(f"{what} could not be read: Redis is unreachable ({exc})") from exc
        return found if isinstance(found, bytes | None) else str(found).encode()


class RedisSpend(RedisRole):
    """Shared spend ledgers (roles.Spend)."""

    async def try_spend(self, ledger: str, usd: float, cap_usd: float, ttl_s: float) -> bool:
        args = [repr(usd), repr(cap_usd), int(ttl_s * 1000)]
        return (
            int(
                await self._run(
                    f"the spend of {ledger} could not be counted", SPEND, [self._keys.spend(ledger)], args
                )
            )
            == 1
        )

    async def settle_spend(self, ledger: str, delta_usd: float) -> None:
        keys, args = [self._keys.spend(ledger)], [repr(delta_usd)]
        await self._run(f"the spend of {ledger} could not be settled", SETTLE_SPEND, keys, args)


def _left_ms(answer: Any) -> int | None:
    """A circuit's reply: the milliseconds its cooldown has left (None: closed)."""
    (left,) = answer
    return None if left is None else int(left)
