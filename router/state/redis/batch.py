"""Auto-pipelining: the Redis commands that requests issue in the same event-loop turn go to
Redis as one pipeline, one round trip and one socket write for all of them. Every command of
the Redis store goes through here: the request path's and the background's alike.

With sixteen requests in flight, their slot acquires and releases would otherwise be sixteen
separate round trips, each paying the client's per-command cost (under load that, not Redis,
was the Redis store's price per request, issue 13). On a single Redis the batches go down one
connection (router/state/redis/line.py), each written as soon as it is formed; with redis-py
(`state.redis_client: redis-py`, Sentinel) each batch is one redis-py pipeline; on a cluster
each batch is a redis-py cluster pipeline, which routes every command to its node (a script
call, which redis-py's cluster pipeline refuses, is sent on its own).

A command someone is waiting on (an acquire, a feedback) leaves in the turn it was issued, so
it waits for no company. A *lazy* command (a release, a task settlement, a prefill end: work
after the answer, which no response waits for) lingers up to `LINGER_S` for the next urgent
one, or for the linger to end: one request's release and settlement then travel with the
next request's acquire, so at low concurrency a request costs one round trip, not three.

Each caller awaits its own command's reply. A caller cancelled while its command is in flight
does not cancel the command (the others share the round trip): the Redis store already treats
an acquire that failed on the client side as possibly run on the server.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, ClassVar

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, RedisError

from router.state.redis.address import RedisAddress
from router.state.redis.line import Command, LineFactory, RedisLine, as_redis_error, deliver, fail
from router.state.redis.scripts import Script

MAX_BATCH = 256  # commands per round trip; a larger backlog leaves in the next one
LINGER_S = 0.002  # the longest a lazy command waits for company (a slot is held that much longer)
TIMEOUT_S = 1.0  # a reply later than this cuts the line (router/state/redis/line.py)


class Batcher:
    line_factory: ClassVar[LineFactory] = RedisLine
    """How a single Redis is spoken to. Our own line; bench/redis_clients.py puts a maintained
    client's pipeline here to compare their cost per request (docs/benchmarks.md)."""

    def __init__(
        self,
        target: RedisAddress | Redis | RedisCluster,
        timeout_s: float = TIMEOUT_S,
        *,
        closes_client: bool = True,
    ) -> None:
        """`target`: a single Redis (its own line, cut after `timeout_s` without a reply) or a
        redis-py client, plain or cluster (with its own socket timeouts; closed with this
        batcher unless `closes_client` is False: another batcher shares it)."""
        self._client = target if isinstance(target, Redis | RedisCluster) else None
        self._cluster = target if isinstance(target, RedisCluster) else None
        self._closes_client = closes_client
        self._line = Batcher.line_factory(target, timeout_s) if isinstance(target, RedisAddress) else None
        self._waiting: list[tuple[Command, asyncio.Future[Any]]] = []
        self._scheduled = False
        self._linger: asyncio.TimerHandle | None = None
        self._rounds: set[asyncio.Task[None]] = set()
        self.round_trips = 0  # batches sent

    async def call(self, *command: Any, lazy: bool = False) -> Any:
        """Send one command (`"ZREM", key, member`) with whatever else is issued in this turn
        (`lazy`: or within `LINGER_S`); its raw reply, or its error."""
        return await self._enqueue([command], lazy)[0]

    async def call_all(self, commands: list[Command], *, lazy: bool = False) -> list[Any]:
        """Send many commands (in order, in as few round trips as MAX_BATCH allows); each one's
        reply or error (an exception instance), once every reply is in."""
        return await asyncio.gather(*self._enqueue(commands, lazy), return_exceptions=True)

    def _enqueue(self, commands: list[Command], lazy: bool) -> list[asyncio.Future[Any]]:
        """Queue `commands`; the futures their callers await. A lazy command's reply reaches
        its caller one loop turn after the urgent replies of the same round trip: the next
        request's acquire, back with the last one's release and settlement, goes on first."""
        loop = asyncio.get_running_loop()
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in commands]
        if lazy:
            for command, reply in zip(commands, replies, strict=True):
                relay: asyncio.Future[Any] = loop.create_future()
                relay.add_done_callback(functools.partial(_pass_on, reply))
                self._waiting.append((command, relay))
            if self._linger is None and not self._scheduled:
                self._linger = loop.call_later(LINGER_S, self._send_soon, loop)
        else:
            self._waiting.extend(zip(commands, replies, strict=True))
            self._send_soon(loop)
        return replies

    def _send_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)

    async def call_script(
        self, script: Script, keys: list[str], args: list[Any], *, lazy: bool = False
    ) -> Any:
        """EVALSHA, loading the script first when the server does not know it (a restart, a
        failover, a new cluster node) and retrying once."""
        for attempt in (1, 2):
            try:
                return await self.call("EVALSHA", script.sha, len(keys), *keys, *args, lazy=lazy)
            except NoScriptError:
                if attempt == 2:
                    raise
                if self._cluster is not None:
                    await self._cluster.script_load(script)  # on every primary
                else:
                    await self.call("SCRIPT", "LOAD", script)
        raise AssertionError("unreachable")

    def _send(self) -> None:
        self._scheduled = False
        batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
        if not batch:
            return
        self.round_trips += 1
        if self._waiting:
            self._send_soon(asyncio.get_running_loop())
        if self._line is not None:
            self._line.send([command for command, _ in batch], [reply for _, reply in batch])
            return
        task = asyncio.get_running_loop().create_task(self._client_round_trip(batch))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _client_round_trip(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> None:
        """One pipeline; on a cluster, the script calls each on their own (its pipeline refuses them)."""
        scripts = [(c, r) for c, r in batch if c[0] == "EVALSHA"] if self._cluster is not None else []
        plain = [(c, r) for c, r in batch if c[0] != "EVALSHA"] if scripts else batch
        try:
            await asyncio.gather(self._pipeline(plain), *(self._one(c, r) for c, r in scripts))
        except BaseException as exc:  # cancelled at shutdown: nobody may wait forever
            fail([reply for _, reply in batch], RedisError(f"the Redis round trip was abandoned ({exc!r})"))
            raise

    async def _pipeline(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> None:
        assert self._client is not None
        if not batch:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for command, _ in batch:
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:  # the store's callers handle RedisError alone
            fail([reply for _, reply in batch], as_redis_error(exc))
            return
        for (_, reply), answer in zip(batch, replies, strict=True):
            deliver(reply, answer)

    async def _one(self, command: Command, reply: asyncio.Future[Any]) -> None:
        assert self._client is not None
        try:
            deliver(reply, await self._client.execute_command(*command))
        except (RedisError, OSError) as exc:
            deliver(reply, as_redis_error(exc))

    async def close(self, timeout_s: float = 1.0) -> None:
        """Send what lingers and wait up to `timeout_s` for the replies in flight, then close
        the line (what is still unanswered fails)."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        waiting = [reply for _, reply in self._waiting]
        while self._waiting:
            self._send()
        if waiting:
            await asyncio.wait(waiting, timeout=timeout_s)
        if self._line is not None:
            await self._line.close()
        if self._client is not None and self._closes_client:
            await self._client.aclose()


def _pass_on(reply: asyncio.Future[Any], relay: asyncio.Future[Any]) -> None:
    """A lazy command's reply, handed on to its caller (unless the caller gave up)."""
    if relay.cancelled():
        reply.cancel()
        return
    error = relay.exception()
    deliver(reply, error if error is not None else relay.result())
