"""`state.redis_client: redis-py` (router/state/redis/clients.py): the store on redis-py's pooled
client, for what only a maintained client does. Against real redis-servers: Sentinel finds the
master it follows, and a password file is read again for every new connection, so a rotated
password is used without a restart. (The role contracts run on this client too:
tests/integration/test_role_contracts.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from router.state.redis.store import RedisStore
from router.state.slots import Slots
from tests.servers import RedisServer, free_port_iter, wait_until


@pytest.fixture
def sentinel(redis_server: RedisServer, tmp_path: Path) -> Iterator[int]:
    """A real Sentinel (redis-server --sentinel) monitoring the suite's Redis as `tg-master`."""
    port = next(free_port_iter())
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {tmp_path}\n"
        f"sentinel monitor tg-master 127.0.0.1 {redis_server.port} 1\n"
    )
    proc = subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        asking = redis.Redis(port=port, socket_timeout=0.5)

        def knows_the_master() -> bool:
            try:
                return asking.sentinel_get_master_addr_by_name("tg-master") is not None
            except redis.RedisError:
                return False

        wait_until(knows_the_master, timeout=15)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_store_follows_the_master_a_sentinel_names(sentinel, redis_server):
    store = RedisStore(f"redis+sentinel://127.0.0.1:{sentinel}/tg-master/0", ["p"], client="redis-py", prefix="sentinel")
    await store.start()
    try:
        lease = await store.leases.try_acquire("p", Slots(1))
        assert lease is not None and not lease.token.startswith("local:")
        held = redis.Redis(port=redis_server.port).zcard("sentinel:slots:{p}")
        assert held == 1  # the lease is in the master the sentinel named
        assert await store.leases.try_acquire("p", Slots(1)) is None
        await store.leases.release(lease)
    finally:
        await store.close()


async def test_a_rotated_password_file_is_used_by_the_next_connection(tmp_path):
    server = RedisServer(password="first").start()
    secret = tmp_path / "password"
    secret.write_text("first\n")
    store = RedisStore(
        f"redis://127.0.0.1:{server.port}/0", ["p"], client="redis-py", password_file=str(secret), prefix="rotated"
    )
    try:
        await store.start()
        assert await store.ping()
        admin = redis.Redis(port=server.port, password="first")
        admin.config_set("requirepass", "second")
        secret.write_text("second\n")
        admin.client_kill_filter(_type="normal", skipme=True)  # the store's connections must reconnect
        deadline = time.monotonic() + 10
        while not await store.ping():  # the next connection reads the file again
            assert time.monotonic() < deadline, "the store never used the rotated password"
            await asyncio.sleep(0.05)
        lease = await store.leases.try_acquire("p", Slots(1))
        assert lease is not None and not lease.token.startswith("local:")
        await store.leases.release(lease)
    finally:
        await store.close()
        server.stop()
