"""The Redis store's connection object: what every role of the store shares (router/state/redis/
store.py composes them). Its two batchers (every command goes through one of them), its keys,
its settings, the degraded flag, and the snapshot the roles publish their fields into.

Two batchers: `request_batch` carries the request path's commands (acquires, releases, prefill
ends, task settlements, quota steps) and nothing else, so no read of windows, reports or admin
data can queue ahead of an acquire; `batch` carries the rest (the refresh, renewals, the flush,
the windows, the control plane). On a single Redis each is a connection of its own; on Redis
Cluster (and with `state.redis_client: redis-py`) both form their pipelines on the one
redis-py client's pool. A role is a class that
takes the link; one that feeds the snapshot is a `SnapshotFeed`, and the store's one refresh
sends every feed's commands in one round trip and hands each feed its own answers back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from redis.exceptions import RedisError, ResponseError

from policies.types import Snapshot
from router.errors import StoreUnavailable
from router.state.redis.batch import Batcher
from router.state.redis.keys import Keys
from router.state.redis.readings import Readings
from router.state.redis.scripts import Script

log = logging.getLogger("tidegate.state")

Command = tuple[Any, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSettings:
    pools: tuple[str, ...]  # every dedicated pool, sorted
    routes: tuple[str, ...]  # every route, sorted
    ttl_ms: int  # a lease's time to live
    window_s: float  # the snapshot's latency window
    retention_s: int  # how long the rollups are kept
    fallback_share: float  # of each pool's capacity, per process, while Redis is away


class RedisLink:
    def __init__(self, batch: Batcher, request_batch: Batcher, keys: Keys, settings: LinkSettings) -> None:
        self.batch = batch  # the background's and the admin's
        self.request_batch = request_batch  # the request path's alone
        self.keys = keys
        self.settings = settings
        self.degraded = False
        self.readings = Readings()  # the refresh's entries, each unreadable one named once
        self.snapshot = Snapshot(now=0.0)  # replaced, never mutated: readers need no copy
        self.stopping = asyncio.Event()

    def publish(self, **fields: Any) -> None:
        """Replace some of the snapshot's fields (a role's own)."""
        self.snapshot = replace(self.snapshot, **fields)

    def degrade(self, exc: Exception) -> None:
        """Redis is unreachable: decide locally until the background refresh reaches it again."""
        if not self.degraded:
            log.warning("state store: Redis unreachable, deciding locally until it is back: %s", exc)
        self.degraded = True


class RedisRole:
    """A role of the Redis store: it takes the link (its batcher and keys at hand). A role on
    the request path (`REQUEST_PATH`) sends on the link's request batcher."""

    REQUEST_PATH = False

    def __init__(self, link: RedisLink) -> None:
        self._link = link
        self._batch = link.request_batch if self.REQUEST_PATH else link.batch
        self._keys = link.keys

    async def _ask(self, what: str, *command: Any) -> Any:
        return await ask(self._batch, what, *command)

    async def _run(self, what: str, script: Script, keys: list[str], args: list[Any]) -> Any:
        """One script; StoreUnavailable, saying `what` failed, when Redis cannot be reached."""
        try:
            return await self._batch.call_script(script, keys, args)
        except RedisError as exc:
            raise StoreUnavailable(f"{what}: {_why(exc)}") from exc


async def ask(batch: Batcher, what: str, *command: Any) -> Any:
    """One command; StoreUnavailable, saying `what` failed, when Redis cannot be reached."""
    try:
        return await batch.call(*command)
    except RedisError as exc:
        raise StoreUnavailable(f"{what}: {_why(exc)}") from exc


class SnapshotFeed(Protocol):
    """A role that feeds the snapshot: its reads for the refresh, and its fields from their answers."""

    def refresh_commands(self) -> list[Command]: ...

    def read_refresh(self, answers: Sequence[Any]) -> dict[str, Any]:
        """The snapshot fields this role owns, from the answers to its own commands (in order;
        an answer may be an exception, Redis refusing that one command)."""


def _why(exc: RedisError) -> str:
    """Unreachable, or reached and refused (a key of the wrong type, a script error)."""
    if isinstance(exc, ResponseError):
        return f"Redis refused the command ({exc})"
    return f"Redis is unreachable ({exc})"
