"""Dedicated slots as expiring leases in Redis, shared by every worker and replica.

Each dedicated pool is a sorted set `tidegate:slots:{pool}` of lease tokens scored by their
expiry (Redis server time, ms). Acquire is one Lua script: drop expired leases, then add one
if fewer than `capacity` remain and nobody waits ahead. A replica renews the leases it holds
every `ttl / 3`, so a replica killed with SIGKILL leaks its slots for at most `lease_ttl_s`.

Waiting for a slot (`wait_s > 0`) is a line shared by every replica: `...:queue:{pool}` holds
waiters by arrival time, `...:seen:{pool}` the time each last polled. A waiter polls with a
jittered backoff from `_POLL_MIN_S` to `_POLL_MAX_S` (and at once when this process releases
a slot of the pool); one that has not polled for `_WAITER_STALE_MS` (its replica died) is
dropped from the line by the next acquire. A line of `max_waiters` is not joined.

An acquire that fails on the client side (a timeout, a cancellation, a lost connection) may
still run on the server, admitting a token nobody holds; a release may fail in a Redis pause.
Every such path removes the token in the background, retrying until the lease TTL, so no ghost
lease outlives the failure. The removal also leaves a tombstone for the token
(`...:gone:{pool}:TOKEN`, one lease TTL) that the acquire script checks first: the removal can
reach Redis before the acquire it undoes, and that acquire must then admit nothing.

While Redis is unreachable (the store is degraded), admission falls back to per-process slots,
`fallback_share` of each pool's capacity; a pool whose keys Redis refuses (a key of the wrong
type) falls back alone. Leases taken locally stay local until released.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from redis.exceptions import RedisError, ResponseError

from router.errors import StoreUnavailable
from router.state.memory.leases import MemoryLeases
from router.state.redis.link import Command, RedisLink, RedisRole, log
from router.state.redis.scripts import ACQUIRE, COUNT, FORGET_PENDING, REMOVE, RENEW
from router.state.slots import Lease, Slots, members

_POLL_MIN_S = 0.05  # a waiter's first poll; each next one 1.5x later, up to _POLL_MAX_S (jittered)
_POLL_MAX_S = 0.25
_LOCAL = "local:"  # token prefix of a slot granted while Redis was unreachable
_WAITER_STALE_MS = 1000  # > _POLL_MAX_S x the largest jitter, with room for a slow round trip
_FORGET_EVERY_S = 0.5
_PREFILL_KEPT_S = 86400


class RedisLeases(RedisRole):
    """Dedicated slots (roles.Leases, roles.PrefillShare) and the pools' counts in the snapshot."""

    REQUEST_PATH = True  # acquires and releases: their own line

    def __init__(self, link: RedisLink) -> None:
        super().__init__(link)
        self._ttl_ms = link.settings.ttl_ms
        self._local = MemoryLeases()  # admission while Redis (or one pool's keys) is unusable
        self.fallback_admissions = 0
        self._held: dict[str, set[str]] = {}  # pool -> the lease members this process holds (renewed)
        self._broken: set[str] = set()  # pools whose keys Redis refuses (wrong type): local slots
        self._released: dict[str, asyncio.Event] = {}
        self._cleanups: set[asyncio.Task[None]] = set()

    def key(self, pool: str) -> str:
        return self._keys.slots(pool)

    async def try_acquire(self, pool: str, slots: Slots, wait_s: float = 0.0) -> Lease | None:
        if self._link.degraded or pool in self._broken:
            return await self._acquire_locally(pool, slots, wait_s)
        token = uuid.uuid4().hex
        keys = self._keys.acquire(pool, token)
        try:
            pending = await self._wait_in_line(pool, keys, slots, token, wait_s)
        except ResponseError as exc:  # Redis is up, but this pool's keys (or its replies) are unusable
            self._forget_later(keys, token, slots.weight)  # in case the script ran all the same
            self._break(pool, exc)
            return await self._acquire_locally(pool, slots, wait_s)
        except RedisError as exc:
            self._forget_later(keys, token, slots.weight)
            self._link.degrade(exc)
            return await self._acquire_locally(pool, slots, wait_s)
        except BaseException:
            self._forget_later(keys, token, slots.weight)
            raise
        if pending is None:
            return None
        self._held.setdefault(pool, set()).update(members(token, slots.weight))
        return Lease(pool, token, slots.weight, slots.prompt_tokens, pending)

    async def _wait_in_line(
        self, pool: str, keys: list[str], slots: Slots, token: str, wait_s: float
    ) -> int | None:
        """Acquire, polling with a jittered backoff while allowed to wait; once admitted, the
        pool's pending prompt tokens (None: not admitted)."""
        deadline = time.monotonic() + wait_s
        wait = "1" if wait_s > 0 else "0"
        args: list[str | int] = [slots.capacity, token, self._ttl_ms, wait, _WAITER_STALE_MS]
        limit = -1 if slots.max_pending_tokens is None else slots.max_pending_tokens
        args += [slots.weight, slots.max_waiters, slots.prompt_tokens, limit]
        pause = _POLL_MIN_S
        while True:
            answer = _reply_int(await self._batch.call_script(ACQUIRE, keys, args))
            if answer >= 1:
                return answer - 1
            remaining = deadline - time.monotonic()
            if answer < 0 or remaining <= 0:  # the line is full, or the wait is over
                if wait_s > 0:  # out of the line (it holds no slot: removing none is a no-op)
                    await self._remove(keys, token, slots.weight)
                return None
            await self._pause(pool, min(pause * random.uniform(0.8, 1.2), remaining))
            pause = min(pause * 1.5, _POLL_MAX_S)

    async def _acquire_locally(self, pool: str, slots: Slots, wait_s: float) -> Lease | None:
        local = replace(slots, capacity=max(1, int(slots.capacity * self._link.settings.fallback_share)))
        lease = await self._local.try_acquire(pool, local, wait_s)
        if lease is None:
            return None
        self.fallback_admissions += 1
        return Lease(pool, _LOCAL + lease.token, lease.weight)

    def _break(self, pool: str, exc: RedisError) -> None:
        """One pool falls back to local slots; the others stay shared. The refresh mends it
        when the pool's keys answer again."""
        if pool not in self._broken:
            log.error(
                "state store: the keys of pool %s are unusable (%s); this pool decides locally "
                "(fallback_share) until they are fixed, e.g. DEL %s",
                pool,
                exc,
                " ".join(self._keys.line(pool)),
            )
        self._broken.add(pool)

    def refresh_commands(self) -> list[Command]:
        """The refresh's read of every pool: live leases, waiters, pending prompt tokens."""
        commands: list[Command] = []
        for pool in self._link.settings.pools:
            line = self._keys.line(pool)
            commands.append(("EVAL", COUNT, 3, line[0], line[1], line[4]))
        return commands

    def read_refresh(self, answers: Sequence[Any]) -> dict[str, Any]:
        """Each pool's counts from its COUNT reply; a pool whose keys Redis refused is broken
        (local slots), one that answers again mended. A pool's own error breaks that pool only."""
        counts = {}
        for pool, answer in zip(self._link.settings.pools, answers, strict=True):
            if isinstance(answer, ResponseError):
                self._break(pool, answer)
                continue
            if isinstance(answer, BaseException):
                raise answer
            if pool in self._broken:
                log.warning("state store: the keys of pool %s answer again: shared slots", pool)
                self._broken.discard(pool)
            if n := self._link.readings.value(f"pool {pool}", answer, _counts):
                counts[pool] = n
        return {
            "in_flight": {pool: n[0] for pool, n in counts.items()},
            "waiting": {pool: n[1] for pool, n in counts.items()},
            "pending_prompt_tokens": {pool: n[2] for pool, n in counts.items()},
        }

    @property
    def broken(self) -> set[str]:
        """The pools deciding locally while their keys are unusable."""
        return self._broken

    async def _remove(self, keys: list[str], token: str, weight: int) -> None:
        """`token` out of the pool's slots (all `weight` members), its line and its pending
        tokens, and marked gone so that its acquire, wherever it still is, admits nothing."""
        await self._batch.call_script(REMOVE, keys, [token, weight, self._ttl_ms])

    def _forget_later(self, keys: list[str], token: str, weight: int) -> None:
        """Remove `token` in the background, retrying until the lease would have expired
        anyway (see the module docstring)."""

        async def forget() -> None:
            give_up = time.monotonic() + self._ttl_ms / 1000
            while True:
                try:
                    await self._remove(keys, token, weight)
                    return
                except RedisError:
                    if time.monotonic() > give_up or self._link.stopping.is_set():
                        return
                    await asyncio.sleep(_FORGET_EVERY_S)

        task = asyncio.get_running_loop().create_task(forget())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _pause(self, pool: str, seconds: float) -> None:
        """Sleep until the next poll, or less if this process releases a slot of the pool."""
        released = self._released.setdefault(pool, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(released.wait(), seconds)

    async def release(self, lease: Lease) -> None:
        if lease.token.startswith(_LOCAL):
            await self._local.release(Lease(lease.pool, lease.token.removeprefix(_LOCAL), lease.weight))
            return
        held = members(lease.token, lease.weight)
        self._held.get(lease.pool, set()).difference_update(held)
        key = self.key(lease.pool)
        try:
            if lease.prompt_tokens > 0:
                slots = self._batch.call("ZREM", key, *held, lazy=True)
                await asyncio.gather(slots, self._forget(lease))  # one pipeline
            else:
                await self._batch.call("ZREM", key, *held, lazy=True)
        except RedisError as exc:  # retried (idempotent, with the removal's tombstone) until it lands
            log.warning("state store: release on %s failed, retrying until it lands: %s", lease.pool, exc)
            self._forget_later(self._keys.acquire(lease.pool, lease.token), lease.token, lease.weight)
        released = self._released.pop(lease.pool, None)
        if released is not None:
            released.set()

    async def prefilled(self, lease: Lease) -> None:
        if lease.token.startswith(_LOCAL):
            await self._local.prefilled(Lease(lease.pool, lease.token.removeprefix(_LOCAL), lease.weight))
            return
        if lease.prompt_tokens <= 0:
            return
        try:
            await self._forget(lease)
        except RedisError as exc:
            log.warning("state store: prefill end on %s lost (release clears it): %s", lease.pool, exc)

    async def _forget(self, lease: Lease) -> None:
        await self._batch.call_script(
            FORGET_PENDING, self._keys.pending(lease.pool), [lease.token], lazy=True
        )

    async def prefill_samples(
        self, pool: str, new: Sequence[tuple[float, float]], keep: int
    ) -> list[tuple[float, float]]:
        """One list per pool (`...:prefill:{pool}`) that every replica appends to and trims to
        `keep`; it expires a day after its last write."""
        key = self._keys.prefill(pool)
        commands: list[tuple[Any, ...]] = []
        if new:
            commands.append(("RPUSH", key, *(f"{tokens:g}:{ttft_ms:.3f}" for tokens, ttft_ms in new)))
            commands += [("LTRIM", key, -keep, -1), ("EXPIRE", key, _PREFILL_KEPT_S)]
        commands.append(("LRANGE", key, 0, -1))
        *_, found = await self._link.batch.call_all(commands)
        if isinstance(found, RedisError):
            raise StoreUnavailable(f"the prefill samples could not be shared ({found})") from found
        samples = []
        for raw in found:
            tokens, _, ttft = (raw.decode() if isinstance(raw, bytes) else str(raw)).partition(":")
            with contextlib.suppress(ValueError):
                samples.append((float(tokens), float(ttft)))
        return samples

    async def renew(self) -> None:
        """Push the expiry of every lease this process holds (one round trip)."""
        commands = [
            ("EVAL", RENEW, 3, self.key(pool), *self._keys.pending(pool), self._ttl_ms, *tokens)
            for pool, tokens in self._held.items()
            if tokens
        ]
        _raise_first(await self._link.batch.call_all(commands))

    async def release_all(self) -> None:
        """Give back every lease this process still holds (the end of a drain)."""
        commands: list[tuple[Any, ...]] = []
        for pool, tokens in self._held.items():
            if tokens:
                commands.append(("ZREM", self.key(pool), *tokens))
                commands += [("EVAL", FORGET_PENDING, 2, *self._keys.pending(pool), t) for t in tokens]
        _raise_first(await self._link.batch.call_all(commands))
        self._held.clear()

    def local_counts(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """(in flight, waiting, pending tokens) of the slots granted locally."""
        local = self._local
        return local.in_flight(), local.waiting(), local.pending_prompt_tokens()


def _reply_int(reply: Any) -> int:
    """The acquire script's integer; a reply of another type is the pool's fault to report
    (ResponseError: the pool decides locally), never a 500 of the request."""
    try:
        return int(reply)
    except (TypeError, ValueError):
        raise ResponseError(f"an unexpected reply to the acquire: {reply!r:.80}") from None


def _counts(answer: Any) -> tuple[int, int, int]:
    return int(answer[0]), int(answer[1]), int(answer[2])


def _raise_first(answers: Sequence[Any]) -> None:
    error = next((a for a in answers if isinstance(a, BaseException)), None)
    if error is not None:
        raise error
