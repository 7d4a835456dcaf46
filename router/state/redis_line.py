"""One Redis connection used as a line: commands are written in order, as soon as they are
handed over, and their replies are matched back in that order as bytes arrive.

A redis-py pipeline cost about 0.2 ms of CPU per round trip on a 2-core VM (a pool checkout,
a Pipeline object, a retry wrapper, a task for the write timeout, a timeout per read), and a
writer and a reader task per connection still cost two task switches per round trip; the
same bytes written from the caller's turn and parsed in the transport's callback cost a
fraction of that (issue 13). redis-py still opens the connection (the URL, TLS, the
handshake: AUTH, SELECT, client name); its socket is then handed to this line's protocol.
hiredis (a core dependency, redis-py's own parser) packs the commands, 7x faster than
redis-py's asyncio packer (4 us against 29 us for the acquire), and parses the replies, each
handed to its command's future.

A line that stops answering is cut: when the oldest command has waited `timeout_s` for its
reply, every command in flight fails with a TimeoutError and the connection is dropped. A
dropped or refused connection fails the commands in flight with a ConnectionError. The next
command opens a new connection. Either way a caller sees a RedisError, as from a pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Command = tuple[Any, ...]  # ("ZREM", key, member, ...)


def _reply_error(message: str) -> ResponseError:
    """An error reply as redis-py would raise it (NoScriptError: the store loads the script)."""
    return NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)


class _Replies(asyncio.Protocol):
    """The line's end of the socket: parses what arrives and hands each reply on."""

    def __init__(self, line: RedisLine, conn: AbstractConnection) -> None:
        self._line = line
        self._conn = conn
        self._parser = hiredis.Reader(protocolError=RedisConnectionError, replyError=_reply_error)

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        while True:
            try:
                reply = self._parser.gets()
            except RedisError as exc:  # not the Redis protocol: nothing after it can be trusted
                self._line._drop(self._conn, exc)
                return
            if reply is False:
                return
            if not self._line._answer(self._conn, reply):
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._line._drop(self._conn, RedisConnectionError(f"Redis closed the connection ({exc or 'EOF'})"))


class RedisLine:
    def __init__(self, redis: Redis, timeout_s: float = 1.0) -> None:
        self._pool = redis.connection_pool
        self._timeout_s = timeout_s
        self._conn: AbstractConnection | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._unsent: list[tuple[list[Command], list[asyncio.Future[Any]]]] = []
        self._in_flight: deque[tuple[float, asyncio.Future[Any]]] = deque()  # (written at, reply)
        self._connecting: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()

    def send(self, commands: list[Command], replies: list[asyncio.Future[Any]]) -> None:
        """Write `commands` now (or once connected); each reply or error lands in its future."""
        if self._closed:
            fail(replies, RedisConnectionError("the Redis line is closed"))
        elif self._transport is not None:
            self._write(self._transport, commands, replies)
        else:
            self._unsent.append((commands, replies))
            if self._connecting is None:
                self._connecting = asyncio.get_running_loop().create_task(self._connect())

    def _write(
        self, transport: asyncio.WriteTransport, commands: list[Command], replies: list[asyncio.Future[Any]]
    ) -> None:
        """Pack and write; a command hiredis cannot pack (a bug: an argument of the wrong type)
        fails its own caller, never the others in the batch."""
        now = time.monotonic()
        packed = []
        for command, reply in zip(commands, replies, strict=True):
            try:
                packed.append(hiredis.pack_command(command))
            except (TypeError, ValueError) as exc:
                reply.set_exception(RedisError(f"cannot send {command[0]!r} to Redis: {exc}"))
                continue
            self._in_flight.append((now, reply))
        transport.write(b"".join(packed))
        self._arm_watchdog()

    async def _connect(self) -> None:
        conn = self._pool.connection_class(**self._pool.connection_kwargs)
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
            transport = _transport_of(conn)
        except (RedisError, OSError) as exc:
            error = as_redis_error(exc)
            for _, replies in self._unsent:
                fail(replies, error)
            self._unsent.clear()
            await _disconnect(conn)
            return
        finally:
            self._connecting = None
        if self._closed:
            await _disconnect(conn)
            return
        transport.set_protocol(_Replies(self, conn))
        self._conn, self._transport = conn, transport
        unsent, self._unsent = self._unsent, []
        for commands, replies in unsent:
            self._write(transport, commands, replies)

    def _answer(self, conn: AbstractConnection, answer: Any) -> bool:
        """One reply, for the oldest command in flight; False when the line was dropped."""
        if self._conn is not conn:
            return False
        if not self._in_flight:  # a reply nobody asked for: the line is out of step
            self._drop(conn, RedisConnectionError("a Redis reply arrived with no command waiting"))
            return False
        _, reply = self._in_flight.popleft()
        deliver(reply, answer)
        return True

    def _arm_watchdog(self) -> None:
        if self._watchdog is None and self._in_flight:
            due = self._in_flight[0][0] + self._timeout_s - time.monotonic()
            self._watchdog = asyncio.get_running_loop().call_later(max(0.0, due), self._check)

    def _check(self) -> None:
        self._watchdog = None
        if not self._in_flight or self._conn is None:
            return
        if time.monotonic() - self._in_flight[0][0] >= self._timeout_s:
            self._drop(self._conn, RedisTimeoutError(f"no reply from Redis within {self._timeout_s:g} s"))
        else:
            self._arm_watchdog()

    def _drop(self, conn: AbstractConnection, error: RedisError) -> None:
        """The connection is done for: fail what is in flight and close it (in the background)."""
        if self._conn is not conn:
            return  # already dropped
        self._conn = self._transport = None
        self._fail_in_flight(error)
        closing = asyncio.get_running_loop().create_task(_disconnect(conn))
        self._closing.add(closing)  # the loop keeps only a weak reference to a task
        closing.add_done_callback(self._closing.discard)

    def _fail_in_flight(self, error: RedisError) -> None:
        fail([reply for _, reply in self._in_flight], error)
        self._in_flight.clear()

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        error = RedisConnectionError("the Redis line is closed")
        conn, self._conn, self._transport = self._conn, None, None
        self._fail_in_flight(error)
        if conn is not None:
            await _disconnect(conn)
        for _, replies in self._unsent:
            fail(replies, error)
        self._unsent.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()


def _transport_of(conn: AbstractConnection) -> asyncio.WriteTransport:
    """The socket redis-py opened. redis-py keeps it as the transport of its StreamWriter; a
    version that no longer does is refused here, loudly, at the first command."""
    writer = getattr(conn, "_writer", None)
    transport = getattr(writer, "transport", None)
    if not (
        callable(getattr(transport, "write", None)) and callable(getattr(transport, "set_protocol", None))
    ):
        raise RedisConnectionError(
            "this redis-py version does not expose its connection's transport (Connection._writer); "
            "tidegate's Redis line needs it"
        )
    # uvloop's transports have asyncio's methods without being its classes' subclasses
    return cast(asyncio.WriteTransport, transport)


async def _disconnect(conn: AbstractConnection) -> None:
    with contextlib.suppress(RedisError, OSError):
        await conn.disconnect(nowait=True)


def deliver(reply: asyncio.Future[Any], answer: Any) -> None:
    """A command's reply (an exception instance: its error) to its caller, unless the caller
    gave up (its future is done: cancelled)."""
    if reply.done():
        return
    if isinstance(answer, BaseException):
        reply.set_exception(answer)
    else:
        reply.set_result(answer)


def fail(replies: Sequence[asyncio.Future[Any]], error: BaseException) -> None:
    for reply in replies:
        deliver(reply, error)


def as_redis_error(exc: BaseException) -> RedisError:
    """What the store's callers catch: a socket error as a redis-py ConnectionError."""
    return exc if isinstance(exc, RedisError) else RedisConnectionError(str(exc))
