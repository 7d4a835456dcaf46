"""What every part of the Redis store shares: its one Batcher (every command goes through it),
its keys, its settings and the snapshot it refreshes. RedisStore (router/state/redis/store.py)
sets them once; each role module (leases, series, control, tasks) reads them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.exceptions import RedisError, ResponseError

from policies.types import Snapshot
from router.errors import StoreUnavailable
from router.state.redis.batch import Batcher
from router.state.redis.keys import Keys
from router.state.redis.scripts import Script

log = logging.getLogger("tidegate.state")


class RedisParts:
    _batch: Batcher
    _keys: Keys
    _cluster: bool
    _pools: list[str]
    _routes: list[str]
    _ttl_ms: int
    _window_s: float
    _retention_s: int
    _snapshot: Snapshot
    _stopping: asyncio.Event
    degraded: bool

    async def _ask(self, what: str, *command: Any) -> Any:
        """One command; StoreUnavailable, saying `what` failed, when Redis cannot be reached."""
        try:
            return await self._batch.call(*command)
        except RedisError as exc:
            raise StoreUnavailable(f"{what}: {_why(exc)}") from exc

    async def _run(self, what: str, script: Script, keys: list[str], args: list[Any]) -> Any:
        """One script, the same way."""
        try:
            return await self._batch.call_script(script, keys, args)
        except RedisError as exc:
            raise StoreUnavailable(f"{what}: {_why(exc)}") from exc

    def _degrade(self, exc: Exception) -> None:
        """Redis is unreachable: decide locally until the background refresh reaches it again."""
        if not self.degraded:
            log.warning("state store: Redis unreachable, deciding locally until it is back: %s", exc)
        self.degraded = True


def _why(exc: RedisError) -> str:
    """Unreachable, or reached and refused (a key of the wrong type, a script error)."""
    if isinstance(exc, ResponseError):
        return f"Redis refused the command ({exc})"
    return f"Redis is unreachable ({exc})"
