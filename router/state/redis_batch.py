"""Auto-pipelining: the Redis commands that requests issue in the same event-loop turn go to
Redis as one pipeline, one round trip and one socket write for all of them.

With sixteen requests in flight, their slot acquires and releases would otherwise be sixteen
separate round trips, each paying redis-py's per-command cost (pool checkout, packing, a
syscall, a read timeout): under load that, not Redis, was the Redis store's price per request
(issue 13). A lone command still leaves in the same turn it was issued, so nothing waits for
company.

Each caller awaits its own command's reply. A caller cancelled while its command is in flight
does not cancel the command (the others share the round trip): the Redis store already treats
an acquire that failed on the client side as possibly run on the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

Queue = Callable[[Any], object]  # puts one command on a pipeline: `lambda pipe: pipe.zrem(...)`

MAX_BATCH = 256  # commands per round trip; a larger backlog leaves in the next one


class Batcher:
    def __init__(self, redis: Redis | RedisCluster) -> None:
        self._redis = redis
        self._waiting: list[tuple[Queue, asyncio.Future[Any]]] = []
        self._scheduled = False
        self._rounds: set[asyncio.Task[None]] = set()

    async def call(self, queue: Queue) -> Any:
        """Send one command with whatever else is issued in this turn; its reply, or its error."""
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((queue, reply))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)
        return await reply

    async def call_script(self, sha: str, source: str, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA, loading the script first when the server does not know it (a restart, a
        failover, a new cluster node) and retrying once. redis-py refuses EVALSHA in a cluster
        pipeline, so on a cluster each script call is its own round trip."""
        for attempt in (1, 2):
            try:
                if isinstance(self._redis, RedisCluster):
                    return await self._redis.evalsha(sha, len(keys), *keys, *args)
                return await self.call(lambda pipe: pipe.evalsha(sha, len(keys), *keys, *args))
            except NoScriptError:
                if attempt == 2:
                    raise
                await self._redis.script_load(source)
        raise AssertionError("unreachable")

    def _send(self) -> None:
        self._scheduled = False
        batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
        if self._waiting:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send)
        task = asyncio.get_running_loop().create_task(self._round_trip(batch))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _round_trip(self, batch: list[tuple[Queue, asyncio.Future[Any]]]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for queue, _ in batch:
                    queue(pipe)
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:  # the store's callers handle RedisError alone
            error = exc if isinstance(exc, RedisError) else RedisConnectionError(str(exc))
            for _, reply in batch:
                if not reply.done():
                    reply.set_exception(error)
            return
        except BaseException as exc:  # cancelled at shutdown: nobody may wait forever
            for _, reply in batch:
                if not reply.done():
                    reply.set_exception(RedisError(f"the Redis round trip was abandoned ({exc!r})"))
            raise
        for (_, reply), answer in zip(batch, replies, strict=True):
            if reply.done():  # its caller was cancelled
                continue
            if isinstance(answer, BaseException):
                reply.set_exception(answer)
            else:
                reply.set_result(answer)
