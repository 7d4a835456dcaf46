"""Maintained Redis clients as the Redis store's line, to compare their cost per request with
our own line's (router/state/redis/line.py) in `python -m bench.overhead --clients`.

Each is a `Line`: it takes a batch the Batcher formed in one loop turn and sends it as one
pipeline through the client's public API, with the client's own connection handling, then
hands each raw reply (RESP2, bytes as Redis sent them) or error to its command's future, as
our line does. Only what the benchmark needs is covered: TCP, a password and a database.

    python -m bench.redis_clients CLIENT serve --config FILE   # `tidegate serve` on CLIENT

valkey-glide and coredis are not dependencies of tidegate: `pip install -e '.[bench]'` adds
them (the benchmark says so when one is missing).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from router.state.redis.address import RedisAddress
from router.state.redis.batch import Batcher
from router.state.redis.line import Command, Line, as_redis_error, deliver, fail
from tidegate.cli.main import main as tidegate

Batch = list[tuple[Command, asyncio.Future[Any]]]


def _error_reply(message: str) -> ResponseError:
    """An error reply as redis-py's class (the store reloads a script on NoScriptError)."""
    no_script = "NOSCRIPT" in message or "NoScriptError" in message
    return NoScriptError(message) if no_script else ResponseError(message)


class _PipelinedLine:
    """A batch becomes one task that runs one pipeline; what the client raises fails the batch."""

    def __init__(self, address: RedisAddress, timeout_s: float) -> None:
        if address.unix_path is not None or address.tls:
            raise SystemExit("bench.redis_clients: TCP without TLS only")
        self._address, self._timeout_s = address, timeout_s
        self._rounds: set[asyncio.Task[None]] = set()

    def send(self, commands: list[Command], replies: list[asyncio.Future[Any]]) -> None:
        task = asyncio.get_running_loop().create_task(
            self._round_trip(list(zip(commands, replies, strict=True)))
        )
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _round_trip(self, batch: Batch) -> None:
        try:
            answers = await asyncio.wait_for(self._pipeline([c for c, _ in batch]), self._timeout_s)
        except Exception as exc:  # the client's own connection and timeout errors
            fail([reply for _, reply in batch], as_redis_error(exc))
            return
        for (_, reply), answer in zip(batch, answers, strict=True):
            deliver(reply, answer)

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        raise NotImplementedError

    async def close(self) -> None:
        if self._rounds:
            await asyncio.wait(self._rounds, timeout=self._timeout_s)


class RedisPyLine(_PipelinedLine):
    """redis-py's asyncio client: a pipeline per batch (`transaction=False`), raw replies."""

    def __init__(self, address: RedisAddress, timeout_s: float) -> None:
        super().__init__(address, timeout_s)
        self._client = redis.asyncio.Redis(
            host=address.host,
            port=address.port,
            db=address.db,
            username=address.username,
            password=address.password,
            max_connections=64,
            socket_timeout=timeout_s,
            protocol=2,
        )
        for name in list(self._client.response_callbacks):  # the replies as Redis sent them
            self._client.set_response_callback(str(name), _as_sent)

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            answers: list[Any] = await pipe.execute(raise_on_error=False)
        return answers

    async def close(self) -> None:
        await super().close()
        await self._client.aclose()


class GlideLine(_PipelinedLine):
    """valkey-glide (Rust core, one multiplexed connection): a non-atomic Batch per batch."""

    def __init__(self, address: RedisAddress, timeout_s: float) -> None:
        super().__init__(address, timeout_s)
        self._client: Any = None
        self._opening: asyncio.Lock | None = None

    async def _connected(self) -> Any:
        glide = _optional("glide")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._client is None:
                a = self._address
                credentials = glide.ServerCredentials(a.password, a.username) if a.password else None
                config = glide.GlideClientConfiguration(
                    [glide.NodeAddress(a.host, a.port)],
                    database_id=a.db,
                    credentials=credentials,
                    protocol=glide.ProtocolVersion.RESP2,
                    request_timeout=int(self._timeout_s * 1000),
                )
                self._client = await glide.GlideClient.create(config)
        return self._client

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        glide = _optional("glide")
        client = await self._connected()
        batch = glide.Batch(is_atomic=False)
        for command in commands:
            batch.custom_command([_as_bytes(part) for part in command])
        answers = await client.exec(batch, raise_on_error=False)
        return [_error_reply(str(a)) if isinstance(a, glide.RequestError) else a for a in answers or []]

    async def close(self) -> None:
        await super().close()
        if self._client is not None:
            await self._client.close()


class CoredisLine(_PipelinedLine):
    """coredis: a pipeline per batch (`transaction=False`), each command a raw request."""

    def __init__(self, address: RedisAddress, timeout_s: float) -> None:
        super().__init__(address, timeout_s)
        self._client = _optional("coredis").Redis(
            host=address.host,
            port=address.port,
            db=address.db,
            username=address.username,
            password=address.password,
            stream_timeout=timeout_s,
        )
        self._owner: asyncio.Task[None] | None = None
        self._ready, self._closing = asyncio.Event(), asyncio.Event()

    async def _hold(self) -> None:
        """coredis 6 is entered and left in one task (anyio): this one, for the line's life."""
        async with self._client:
            self._ready.set()
            await self._closing.wait()

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        if self._owner is None:
            self._owner = asyncio.get_running_loop().create_task(self._hold())
        await self._ready.wait()
        pipe = self._client.pipeline(transaction=False, raise_on_error=False)
        async with pipe:
            for command in commands:
                pipe.create_request(_as_bytes(command[0]).upper(), *command[1:], callback=_as_sent)
        return [_as_redis_reply(answer) for answer in pipe.results or ()]

    async def close(self) -> None:
        await super().close()
        if self._owner is not None:
            self._closing.set()
            await self._owner


def _optional(module: str) -> ModuleType:
    """A client that is not a dependency of tidegate (`pip install -e .[bench]`)."""
    return importlib.import_module(module)


def _as_sent(response: Any, **_: Any) -> Any:
    return response


def _as_bytes(part: Any) -> bytes:
    if isinstance(part, bytes):
        return part
    return str(part).encode() if not isinstance(part, float) else repr(part).encode()


def _as_redis_reply(answer: Any) -> Any:
    """coredis's error classes as redis-py's (the store catches those)."""
    if isinstance(answer, BaseException) and not isinstance(answer, RedisError):
        name = type(answer).__name__
        if "Connection" in name or "Timeout" in name:
            return RedisConnectionError(str(answer))
        return _error_reply(f"{name}: {answer}")
    return answer


CLIENTS: dict[str, Callable[[RedisAddress, float], Line]] = {
    "redis-py": RedisPyLine,
    "glide": GlideLine,
    "coredis": CoredisLine,
}
MODULES = {"redis-py": "redis", "glide": "glide", "coredis": "coredis"}


def missing(client: str) -> str | None:
    """How to install `client`, when it is not importable here."""
    try:
        _optional(MODULES[client])
    except ImportError:
        return "pip install -e '.[bench]'"
    return None


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CLIENTS:
        raise SystemExit(f"usage: python -m bench.redis_clients {{{','.join(CLIENTS)}}} serve ...")
    Batcher.line_factory = CLIENTS[argv[0]]
    return tidegate(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
