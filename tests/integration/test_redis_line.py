"""The Redis line opens its own connection (router/state/redis/line.py): against real
redis-servers it authenticates (a password, an ACL user), selects its database, speaks TLS
and Unix sockets, and in RESP3 tells push frames from replies. A refused handshake fails
start-up with the reason, never a half-working store."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from router.state.redis.address import parse_url
from router.state.redis.batch import Batcher
from router.state.redis.store import RedisStore
from router.state.roles import StoreUnreachableAtStart
from router.state.slots import Slots
from tests.servers import RedisServer, free_port_iter, wait_until


@pytest.fixture(scope="module")
def guarded() -> Iterator[RedisServer]:
    """A Redis with a password and an ACL user `alice`."""
    server = RedisServer(
        "--user", "alice", "on", ">wonderland", "~*", "&*", "+@all", password="s3cret"
    ).start()
    try:
        yield server
    finally:
        server.stop()


async def acquired(url: str) -> bool:
    store = RedisStore(url, ["p"])
    await store.start()
    try:
        lease = await store.leases.try_acquire("p", Slots(2))
        return lease is not None and not lease.token.startswith("local:")
    finally:
        await store.close()


@pytest.mark.parametrize("credentials", [":s3cret@", "default:s3cret@", "alice:wonderland@"])
@pytest.mark.parametrize("protocol", ["", "?protocol=3"])
async def test_the_line_authenticates_with_a_password_or_an_acl_user(guarded, credentials, protocol):
    assert await acquired(f"redis://{credentials}127.0.0.1:{guarded.port}/0{protocol}")


@pytest.mark.parametrize("credentials", ["", ":wrong@", "alice:wrong@"])
async def test_a_refused_handshake_fails_start_up_with_the_reason(guarded, credentials):
    store = RedisStore(f"redis://{credentials}127.0.0.1:{guarded.port}/0", ["p"])
    try:
        with pytest.raises(
            StoreUnreachableAtStart, match=r"state\.redis_url: .*(NOAUTH|WRONGPASS|credentials)"
        ):
            await store.start()
    finally:
        await store.close()


async def test_the_line_uses_its_database(redis_server):
    redis_server.flush()
    store = RedisStore(f"redis://127.0.0.1:{redis_server.port}/3", ["p"])
    await store.start()
    try:
        assert await store.leases.try_acquire("p", Slots(2)) is not None
        in_three = redis.Redis(port=redis_server.port, db=3).zcard(store.leases.key("p"))
        in_zero = redis.Redis(port=redis_server.port, db=0).zcard(store.leases.key("p"))
    finally:
        await store.close()
    assert (in_three, in_zero) == (1, 0)


async def test_the_line_speaks_unix_sockets(tmp_path):
    sock = tmp_path / "redis.sock"
    server = RedisServer("--unixsocket", str(sock), "--unixsocketperm", "700").start()
    try:
        assert await acquired(f"unix://{sock}?db=0")
    finally:
        server.stop()


def _self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate and its key for 127.0.0.1; it signs itself, so it is also its own CA."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _tls_server(cert: Path, key: Path, *, clients_authenticate: bool) -> tuple[int, RedisServer]:
    """A Redis with TLS on one port (and plain on another, for its health check)."""
    tls_port = next(free_port_iter())
    server = RedisServer(
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-ca-cert-file",
        str(cert),
        "--tls-auth-clients",
        "yes" if clients_authenticate else "no",
    ).start()
    return tls_port, server


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    tls_port, server = _tls_server(cert, key, clients_authenticate=False)
    try:
        yield tls_port, cert
    finally:
        server.stop()


async def test_mutual_tls_presents_the_client_certificate_the_url_names(tmp_path):
    """`ssl_certfile`/`ssl_keyfile`: a Redis that asks clients for a certificate takes the
    line with one and refuses it without one, at start."""
    cert, key = _self_signed(tmp_path)
    port, server = _tls_server(cert, key, clients_authenticate=True)
    try:
        base = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
        assert await acquired(f"{base}&ssl_certfile={cert}&ssl_keyfile={key}")
        anonymous = RedisStore(base, ["p"])
        try:
            with pytest.raises(StoreUnreachableAtStart, match=r"state\.redis_url: cannot use Redis"):
                await anonymous.start()
        finally:
            await anonymous.close()
    finally:
        server.stop()


async def test_the_reply_timeout_is_the_configured_one():
    """`state.redis_timeout_s`: against a port whose kernel accepts connections and nothing
    answers, start-up fails naming the timeout it was given."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}/0", ["p"], timeout_s=0.25)
        try:
            with pytest.raises(StoreUnreachableAtStart, match=r"within 0\.25 s"):
                await store.start()
        finally:
            await store.close()


async def test_the_line_speaks_tls_and_checks_the_servers_certificate(tls_redis):
    port, cert = tls_redis
    assert await acquired(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")
    assert await acquired(f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none")
    unverified = RedisStore(f"rediss://127.0.0.1:{port}/0", ["p"])  # the system's CAs do not know it
    try:
        with pytest.raises(StoreUnreachableAtStart, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
            await unverified.start()
    finally:
        await unverified.close()


async def test_resp3_push_frames_are_never_taken_for_replies(redis_server):
    """With client tracking on (RESP3), a key read by the line and changed by another client
    makes Redis push an invalidation onto the line's connection, between replies: every
    command after it must still get its own reply."""
    redis_server.flush()
    batch = Batcher(parse_url(f"redis://127.0.0.1:{redis_server.port}/0?protocol=3"))
    other = redis.Redis(port=redis_server.port)
    try:
        assert await batch.call("CLIENT", "TRACKING", "ON") == b"OK"
        for i in range(20):
            await batch.call("SET", f"k{i}", i)
            assert await batch.call("GET", f"k{i}") == str(i).encode()  # now tracked
            other.set(f"k{i}", "changed")  # an invalidation push is on its way to the line
            assert await batch.call("INCRBY", f"n{i}", i + 1) == i + 1
        assert await batch.call("HGETALL", "none") == {}  # RESP3 maps come back as dicts
    finally:
        await batch.close()
        other.close()


async def test_a_url_that_cannot_be_used_is_refused_naming_the_key():
    with pytest.raises(StoreUnreachableAtStart, match=r"state\.redis_url: scheme 'http'"):
        RedisStore("http://127.0.0.1:6379/0", ["p"])
    with pytest.raises(StoreUnreachableAtStart, match=r"state\.redis_url: protocol=4"):
        RedisStore("redis://127.0.0.1:6379/0?protocol=4", ["p"])


def test_wait_until_sees_the_guarded_server_answer(guarded):
    client = redis.Redis(port=guarded.port, password="s3cret")
    wait_until(lambda: bool(client.ping()))
    assert asyncio.run(acquired(guarded.url))


async def test_an_acquire_never_waits_behind_a_background_command(redis_server, redis_url):
    """Acquires and releases have a connection of their own (issue 37): one blocked behind a
    slow background reply (here a BLPOP nobody answers yet, standing for a long window read)
    is answered first, where on a shared connection it would wait for that reply (FIFO)."""
    store = RedisStore(redis_url, ["p"], timeout_s=10.0, prefix="lanes")
    await store.start()
    try:
        slow = asyncio.create_task(store._link.batch.call("BLPOP", "lanes:never", 8))
        deadline = asyncio.get_running_loop().time() + 5.0
        while _blocked_clients(redis_server) < 1:  # the BLPOP is in Redis, blocking its connection
            assert asyncio.get_running_loop().time() < deadline, "the BLPOP never reached Redis"
            await asyncio.sleep(0.01)
        lease = await store.leases.try_acquire("p", Slots(1))
        assert lease is not None
        await store.leases.release(lease)
        assert not slow.done(), "the acquire was answered only after the background command"
        redis.Redis(port=redis_server.port).lpush("lanes:never", "done")
        assert await slow == [b"lanes:never", b"done"]
    finally:
        await store.close()


def _blocked_clients(server: RedisServer) -> int:
    return int(redis.Redis(port=server.port).info("clients")["blocked_clients"])
