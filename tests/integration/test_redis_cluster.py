"""The shared store on a real three-master Redis Cluster started here: every script touches
one slot, so capacity, the line, the canary, circuits and histograms work as on one Redis."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from router.state.latency import Metric
from router.state.redis.store import RedisStore
from router.state.slots import Slots
from tests.integration.test_shared_state import (
    CAPACITY,
    _route_via,
    burst,
    serverless,
    slow_dedicated,
    write_config,
)
from tests.servers import CliProcess, RedisClusterServers, Sim, wait_until

POOLS = [f"pool-{i}" for i in range(8)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    with tempfile.TemporaryDirectory() as workdir:
        servers = RedisClusterServers(workdir).start()
        try:
            yield servers
        finally:
            servers.stop()


@pytest.fixture
async def replicas(cluster: RedisClusterServers) -> AsyncIterator[list[RedisStore]]:
    """Two stores on the cluster, as two gateway replicas would hold them."""
    cluster.flush()
    stores = [RedisStore(cluster.url, POOLS, routes=["m/ded/d", "m/sl/s"]) for _ in range(2)]
    for store in stores:
        await store.start()
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()


def test_the_pools_under_test_live_on_different_masters(cluster, replicas):
    masters = {cluster.node_of(replicas[0].leases.key(pool)) for pool in POOLS}
    assert len(masters) >= 2, "the test would prove nothing if every pool sat on one master"


async def test_two_replicas_never_grant_more_than_capacity_on_any_pool(replicas):
    async def grab(store: RedisStore, pool: str) -> bool:
        return await store.leases.try_acquire(pool, Slots(3)) is not None

    for pool in POOLS:
        granted = await asyncio.gather(*(grab(replicas[i % 2], pool) for i in range(10)))
        assert sum(granted) == 3, pool


async def test_a_waiter_on_one_replica_gets_the_slot_the_other_releases(replicas):
    a, b = replicas
    held = [await a.leases.try_acquire("pool-1", Slots(2)) for _ in range(2)]
    assert all(held)
    waiter = asyncio.create_task(b.leases.try_acquire("pool-1", Slots(2), wait_s=5.0))
    await a.refresh()
    await a.leases.release(held[0])  # type: ignore[arg-type]
    lease = await asyncio.wait_for(waiter, 6.0)
    assert lease is not None and lease.pool == "pool-1"


async def test_weighted_leases_count_every_slot_across_replicas(replicas):
    a, b = replicas
    assert await a.leases.try_acquire("pool-2", Slots(4, weight=3)) is not None
    assert await b.leases.try_acquire("pool-2", Slots(4, weight=2)) is None
    assert await b.leases.try_acquire("pool-2", Slots(4, weight=1)) is not None
    await b.refresh()
    assert b.snapshot().in_flight["pool-2"] == 4


async def test_canary_and_circuits_set_on_one_replica_reach_the_other(replicas):
    a, b = replicas
    await a.canary.set_canary("m", 35.0)
    await a.circuits.trip("m/ded/d", cooldown_s=30.0, max_cooldown_s=60.0)
    await b.refresh()
    seen = b.snapshot()
    assert seen.canary_percent == {"m": 35.0}
    assert "m/ded/d" in seen.circuit_open and "m/sl/s" not in seen.circuit_open


async def test_histograms_and_counts_from_both_replicas_merge(replicas):
    a, b = replicas
    for value in range(100):
        a.series.observe("m/ded/d", Metric.TTFT, float(value))
        b.series.observe("m/ded/d", Metric.TTFT, float(value + 100))
        b.series.observe("m/sl/s", Metric.TTFT, 5.0)
    a.series.count("m/ded/d", {"requests": 2})
    b.series.count("m/ded/d", {"requests": 3})
    await asyncio.gather(a.series.flush(), b.series.flush())
    merged = await a.series.latency_window(["m/ded/d", "m/sl/s"], Metric.TTFT, 60.0)
    assert merged["m/ded/d"].samples == 200 and merged["m/sl/s"].samples == 100
    figures = merged["m/ded/d"].figures()
    assert figures is not None and 80 <= figures.p50 <= 120  # both halves are in it
    counts = await b.series.counts_window(["m/ded/d"], 60.0)
    assert counts["m/ded/d"]["requests"] == 5


def test_two_gateway_processes_on_a_cluster_share_capacity_and_the_canary(tmp_path, cluster):
    cluster.flush()
    with Sim(slow_dedicated()) as ded, Sim(serverless()) as sl:
        config = write_config(tmp_path / "t.yaml", ded, sl, cluster.url)
        config.write_text(
            config.read_text().replace(
                "auth: {allow_anonymous: true}", "auth: {allow_anonymous: true, admin_key: adm}"
            )
        )
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as a,
            CliProcess("serve", "--config", str(config), "--port", "0") as b,
        ):
            results = burst([a.url, b.url], count=16, max_tokens=20)
            put = httpx.put(
                a.root + "/admin/models/m/canary",
                json={"percent": 0},
                headers={"authorization": "Bearer adm"},
            )
            assert put.status_code == 200
            wait_until(lambda: _route_via(b.url) == ("sl", "canary_out"), timeout=10, interval=0.05)
        ded_stats = ded.stats()
    assert all(text for _, _, text in results)
    assert ded_stats["max_in_flight"] <= CAPACITY
    assert sum(route == "ded" for route, _, _ in results) >= 1
