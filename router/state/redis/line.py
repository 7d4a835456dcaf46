"""One Redis connection used as a line: commands are written in order, as soon as they are
handed over, and their replies are matched back in that order as bytes arrive.

The line opens its own connection with asyncio's public API (TCP, TLS or a Unix socket) and
speaks RESP itself: hiredis (redis-py's own parser, a core dependency) packs the commands and
parses the replies, each handed to its command's future from the transport's callback, with
no writer or reader task. A new connection first sends its handshake (HELLO 3 or AUTH, SELECT,
CLIENT SETNAME: router/state/redis/address.py) and fails the commands waiting for it with a
clear error when the server refuses it. In RESP3, push frames (client tracking, pub/sub) are
told apart from replies and never taken for one.

Why not a maintained client's pipeline: the CPU per request of each, measured side by side in
`python -m bench.overhead --clients` (docs/benchmarks.md), was several times this line's.

A line that stops answering is cut: when the oldest command has waited `timeout_s` for its
reply, every command in flight fails with a TimeoutError and the connection is dropped. A
dropped or refused connection fails the commands in flight with a ConnectionError. The next
command opens a new connection. Either way a caller sees a RedisError (redis-py's exception
classes: the store's callers catch those, whichever client sends their commands).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import hiredis
from redis.exceptions import AuthenticationError, NoScriptError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from router.state.redis.address import RedisAddress

Command = tuple[Any, ...]  # ("ZREM", key, member, ...)
log = logging.getLogger("tidegate.state")


class Line(Protocol):
    """What the Batcher sends a batch down: each command's raw RESP2 reply (an exception
    instance: its error, as a redis-py RedisError) lands in its future."""

    def send(self, commands: list[Command], replies: list[asyncio.Future[Any]]) -> None: ...

    async def close(self) -> None: ...


LineFactory = Callable[[RedisAddress, float], Line]  # (address, reply timeout in s)


def _reply_error(message: str) -> ResponseError:
    """An error reply as redis-py would raise it (NoScriptError: the store loads the script)."""
    return NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)


class _Replies(asyncio.Protocol):
    """The line's end of one connection: parses what arrives and hands each reply on."""

    def __init__(self, line: RedisLine) -> None:
        self._line = line
        self._parser = hiredis.Reader(protocolError=RedisConnectionError, replyError=_reply_error)
        self.transport: asyncio.BaseTransport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        while True:
            try:
                reply = self._parser.gets()
            except RedisError as exc:  # not the Redis protocol: nothing after it can be trusted
                self._line.drop(self, exc)
                return
            if reply is False:
                return
            if isinstance(reply, hiredis.PushNotification):
                log.debug("state store: a RESP3 push frame, not a reply: %s", reply[:1])
                continue
            if not self._line.answer(self, reply):
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._line.drop(self, RedisConnectionError(f"Redis closed the connection ({exc or 'EOF'})"))


class RedisLine:
    def __init__(self, address: RedisAddress, timeout_s: float = 1.0) -> None:
        self._address = address
        self._timeout_s = timeout_s
        self._protocol: _Replies | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._unsent: list[tuple[list[Command], list[asyncio.Future[Any]]]] = []
        self._in_flight: deque[tuple[float, asyncio.Future[Any]]] = deque()  # (written at, reply)
        self._connecting: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False

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
        """Open a connection and send its handshake; once the server accepted it, the waiting
        commands. A refused connection or handshake fails every waiting command with its
        reason (and nothing is sent on a connection whose handshake failed)."""
        try:
            try:
                transport, protocol = await asyncio.wait_for(self._open(), self._timeout_s)
            except (OSError, TimeoutError) as exc:
                self._fail_unsent(RedisConnectionError(f"cannot connect to Redis: {exc!r}"))
                return
            if self._closed:
                transport.close()
                return
            self._protocol = protocol
            handshake = self._address.handshake()
            greeted = [asyncio.get_running_loop().create_future() for _ in handshake]
            self._write(transport, handshake, greeted)  # timed by the watchdog like any command
            refusal = await _refusal(greeted)
            if refusal is None and self._protocol is not protocol:
                refusal = RedisConnectionError("the Redis connection was lost during its handshake")
            if refusal is not None:
                self._fail_unsent(refusal)
                self.drop(protocol, refusal)
                return
            self._transport = transport
            unsent, self._unsent = self._unsent, []
            for commands, replies in unsent:
                self._write(transport, commands, replies)
        finally:
            self._connecting = None

    async def _open(self) -> tuple[asyncio.WriteTransport, _Replies]:
        loop, address = asyncio.get_running_loop(), self._address
        if address.unix_path is not None:
            transport, protocol = await loop.create_unix_connection(lambda: _Replies(self), address.unix_path)
        else:
            context = address.ssl_context()
            server = address.host if context is not None and context.check_hostname else None
            transport, protocol = await loop.create_connection(
                lambda: _Replies(self), address.host, address.port, ssl=context, server_hostname=server
            )
        return transport, protocol

    def answer(self, protocol: _Replies, answer: Any) -> bool:
        """One reply, for the oldest command in flight; False when the line was dropped."""
        if self._protocol is not protocol:
            return False
        if not self._in_flight:  # a reply nobody asked for: the line is out of step
            self.drop(protocol, RedisConnectionError("a Redis reply arrived with no command waiting"))
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
        if not self._in_flight or self._protocol is None:
            return
        if time.monotonic() - self._in_flight[0][0] >= self._timeout_s:
            self.drop(self._protocol, RedisTimeoutError(f"no reply from Redis within {self._timeout_s:g} s"))
        else:
            self._arm_watchdog()

    def drop(self, protocol: _Replies, error: RedisError) -> None:
        """The connection is done for: fail what is in flight and close it."""
        if self._protocol is not protocol:
            return  # already dropped
        self._protocol = self._transport = None
        self._fail_in_flight(error)
        if protocol.transport is not None and not protocol.lost:
            protocol.transport.close()

    def _fail_in_flight(self, error: RedisError) -> None:
        fail([reply for _, reply in self._in_flight], error)
        self._in_flight.clear()

    def _fail_unsent(self, error: RedisError) -> None:
        for _, replies in self._unsent:
            fail(replies, error)
        self._unsent.clear()

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        error = RedisConnectionError("the Redis line is closed")
        if self._protocol is not None:
            self.drop(self._protocol, error)
        self._fail_unsent(error)
        if self._watchdog is not None:
            self._watchdog.cancel()


async def _refusal(greeted: list[asyncio.Future[Any]]) -> RedisError | None:
    """Why the server refused the handshake (wrong password, unknown database), if it did."""
    answers = await asyncio.gather(*greeted, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, ResponseError):
            text = str(answer)
            if text.startswith(("WRONGPASS", "NOAUTH", "NOPERM")) or "AUTH" in text.upper():
                return AuthenticationError(f"Redis refused the credentials: {text}")
            return RedisConnectionError(f"Redis refused the connection's handshake: {text}")
        if isinstance(answer, RedisError):
            return answer
    return None


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
