"""Keep-warm (issue 18): one replica of many sends the probes (a leader lease in the store),
the probes are counted as keep-warm spend and never as requests, `when: dedicated_busy` waits
for a busy dedicated pool, and the day's budget stops them."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis

from policies.types import Snapshot
from router.app import create_app
from router.config import parse_config
from router.request.upstream import Upstream, aiohttp_transport
from router.spill.keep_warm import KeepWarm, hot_hours
from router.state.memory.store import MemoryStore
from tests.conftest import serverless_profile
from tests.servers import Sim, ThreadServer, wait_until
from tidegate.offline.calibration import TtftDistribution

ADMIN = "a" * 32
INTERVAL_S = 0.25


def config_text(sl: Sim, redis_url: str = "", **warm: object) -> str:
    extra = "".join(f", {k}: {v}" for k, v in warm.items())
    state = f"state: {{redis_url: '{redis_url}', leader_ttl_s: 1}}\n" if redis_url else ""
    return (
        f"{state}auth: {{allow_anonymous: true, admin_key: {ADMIN}}}\nmodels:\n  m:\n"
        "    dedicated: [{name: ded, gpu_hour_usd: 0, base_url: 'http://127.0.0.1:9/v1', model: d, max_concurrency: 4}]\n"
        f"    serverless: [{{name: sl, base_url: '{sl.base_url}', model: s, usd_per_mtok_in: 1, "
        f"usd_per_mtok_out: 1, keep_warm: {{interval_s: {INTERVAL_S}{extra}}}}}]\n"
    )


def test_two_replicas_sharing_redis_send_one_replicas_probes_and_hand_over(redis_url):
    leader_key = "tidegate:leader:keep_warm"
    with Sim(serverless_profile()) as sl:
        config = parse_config(config_text(sl, redis_url), {})
        apps = [create_app(config), create_app(config)]
        servers = [ThreadServer(app).__enter__() for app in apps]
        stopped: set[int] = set()
        try:
            wait_until(lambda: sl.stats()["requests"] >= 1, timeout=20)
            started, first = time.monotonic(), sl.stats()["requests"]  # from a probe seen, not from start-up
            wait_until(lambda: sl.stats()["requests"] >= first + 8, timeout=20)
            elapsed = time.monotonic() - started
            # two senders would make twice as many; one makes at most one per interval (a slow
            # machine only makes fewer)
            assert sl.stats()["requests"] - first <= elapsed / INTERVAL_S + 2
            report = httpx.get(
                servers[0].url + "/admin/routes?window=1m", headers={"authorization": f"Bearer {ADMIN}"}
            ).json()
            route = report["models"]["m"]["routes"]["sl"]
            assert route["requests"] == 0  # probes are not traffic
            raw = redis.Redis.from_url(redis_url)
            holder = raw.get(leader_key).decode()
            [leader] = [i for i, app in enumerate(apps) if app.state.keep_warm.token == holder]
            servers[leader].__exit__(None, None, None)  # the leader stops: it resigns its lease
            stopped.add(leader)
            other = apps[1 - leader].state.keep_warm.token
            wait_until(lambda: raw.get(leader_key) == other.encode(), timeout=10)
            before = sl.stats()["requests"]
            wait_until(lambda: sl.stats()["requests"] >= before + 4, timeout=20)  # from the other
        finally:
            for i, server in enumerate(servers):
                if i not in stopped:
                    server.__exit__(None, None, None)


async def test_dedicated_busy_waits_for_a_busy_pool_and_the_days_budget_stops_the_probes():
    with Sim(serverless_profile()) as sl:
        # a probe costs (8 + 1) tokens x $1/M: the budget allows three
        config = parse_config(
            config_text(sl, when="dedicated_busy", busy_above=0.5, max_usd_per_day=0.000028), {}
        )
        model = config.models["m"]
        store = MemoryStore()
        upstream = Upstream(model.endpoints, aiohttp_transport)
        busy = {"ded": 0}
        warm = KeepWarm(config, store, upstream, lambda: Snapshot(now=0.0, in_flight=busy), 10.0)
        try:
            for _ in range(3):
                await warm.tick()
            await asyncio.sleep(0)
            assert sl.stats()["requests"] == 0  # the pool is idle: no spill is plausible
            busy["ded"] = 2  # half of its 4 slots
            deadline = time.monotonic() + 10
            while sl.stats()["requests"] < 3:
                assert time.monotonic() < deadline, sl.stats()
                await warm.tick()
                await asyncio.sleep(INTERVAL_S / 5)
            for _ in range(10):  # well past more intervals: the budget is spent for the day
                await asyncio.sleep(INTERVAL_S / 2)
                await warm.tick()
            await warm.close()
            assert sl.stats()["requests"] == 3
            counts = (await store.series.counts_window(["m/sl"], 60))["m/sl"]
            assert counts["keep_warm"] == 3 and counts.get("requests", 0) == 0
        finally:
            await upstream.aclose()


# --- when: schedule, and a learned interval -----------------------------------------------


def hourly(hour: int, day: int, requests: float, spills: float) -> tuple[int, dict[str, float]]:
    return (
        day * 86400 + hour * 3600,
        {"requests": requests, "reason:saturated": spills, "reason:baseline": 1},
    )


def test_the_schedule_is_the_hours_with_enough_spills_a_day():
    series = {
        "m/ded": [hourly(3, 0, 10, 0), hourly(3, 1, 10, 0)],
        "m/sl": [hourly(3, 0, 4, 4), hourly(3, 1, 2, 2), hourly(14, 0, 1, 1), hourly(20, 1, 9, 0)],
    }
    # hour 3: 6 spills over 2 days (3 a day); hour 14: 1 in 2 days (0.5 a day); hour 20: none
    assert hot_hours(series, days=2, min_spills=1) == frozenset({3})
    assert hot_hours(series, days=2, min_spills=0.5) == frozenset({3, 14})
    assert hot_hours({"m/sl": []}, days=1, min_spills=1) is None  # no history: keep warm always


async def test_a_scheduled_route_is_kept_warm_only_in_the_hours_the_model_spilled(redis_url):
    with Sim(serverless_profile()) as sl:
        # validated with Redis (a schedule needs shared history); run here on a memory store,
        # whose current hour is all the history this test writes
        config = parse_config(config_text(sl, redis_url, when="schedule"), {})
        model = config.models["m"]
        hour = time.gmtime().tm_hour
        for spills, expect_pings in ((None, True), (0, False), (3, True)):
            store = MemoryStore(config.route_keys())
            if spills is not None:
                store.series.count(
                    "m/sl", {"requests": 5, "reason:saturated": spills, "reason:baseline": 5 - spills}
                )
            upstream = Upstream(model.endpoints, aiohttp_transport)
            warm = KeepWarm(config, store, upstream, lambda: Snapshot(now=0.0), 10.0)
            before = sl.stats()["requests"]
            try:
                await warm.tick()
                deadline = time.monotonic() + 10
                while expect_pings and sl.stats()["requests"] < before + 1:  # the probe arrived
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                await warm.close()
            finally:
                await upstream.aclose()
            if time.gmtime().tm_hour != hour:
                pytest.skip("the UTC hour changed during the test")
            expected = None if spills is None else ([hour] if spills else [])
            assert warm.schedules() == {"m/sl": expected}
            assert warm.pings_sent == (1 if expect_pings else 0)


@pytest.mark.timing  # pings timed against an idle timeout: alone
async def test_a_cold_probe_shrinks_the_interval_until_the_route_stays_warm():
    # scale-to-zero after 1 s idle, and a 0.6-0.7 s load when cold
    profile = serverless_profile(
        time_scale=1.0, ttft=TtftDistribution(0.02, 0.1, cold_range_s=(0.6, 0.7)), idle_to_cold_s=1.0
    )
    with Sim(profile) as sl:
        config = parse_config(
            f"auth: {{allow_anonymous: true, admin_key: {ADMIN}}}\nmodels:\n  m:\n"
            "    dedicated: [{name: ded, gpu_hour_usd: 0, base_url: 'http://127.0.0.1:9/v1', model: d, max_concurrency: 4}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s, keep_warm: {{interval_s: 2.5,"
            " learn: true, min_interval_s: 0.2, cold_ms: 300}}]\n",
            {},
        )
        upstream = Upstream(config.models["m"].endpoints, aiohttp_transport)
        warm = KeepWarm(config, MemoryStore(), upstream, lambda: Snapshot(now=0.0), 10.0)
        try:
            deadline = time.monotonic() + 30
            while warm.intervals()["m/sl"] > 1.0:  # each cold probe halves the gap before it
                assert time.monotonic() < deadline, (warm.intervals(), sl.stats())
                await warm.tick()
                await asyncio.sleep(0.02)
            learned = warm.intervals()["m/sl"]
            assert 0.2 <= learned <= 1.0
            assert sl.stats()["cold_starts"] >= 1  # learned from evidence, not assumed
            cold, probes = sl.stats()["cold_starts"], sl.stats()["requests"]
            # four more probes at the learned interval; a loaded machine may send one late, past
            # the 1 s idle, and that probe finds the route cold through no fault of the interval
            late, seen, last_at = 0, probes, time.monotonic()
            while seen < probes + 4:
                assert time.monotonic() < deadline, sl.stats()
                await warm.tick()
                await asyncio.sleep(0.02)
                if (now_seen := sl.stats()["requests"]) > seen:
                    late += time.monotonic() - last_at > 1.0
                    seen, last_at = now_seen, time.monotonic()
            assert sl.stats()["cold_starts"] - cold <= late, late  # the route stayed warm
            assert warm.intervals()["m/sl"] == learned
        finally:
            await warm.close()
            await upstream.aclose()
