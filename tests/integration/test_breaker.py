"""Circuit breaking: the counting (pure), the gate (pure), the shared open state (both
stores), and the whole loop through a gateway in front of a failing simulator."""

from __future__ import annotations

import openai
import pytest

from policies import registry
from policies.base import Reason, RequestContext
from policies.types import Snapshot
from router.app import create_app
from router.config import BreakerConfig, DedicatedEndpoint, ModelConfig, ServerlessEndpoint, parse_config
from router.request.breaker import RouteCounts
from router.state.memory.store import MemoryStore
from router.state.redis.store import RedisStore
from tests.conftest import dedicated_profile, serverless_profile
from tests.servers import Sim, ThreadServer, wait_until

CONFIG = BreakerConfig(consecutive_failures=3, error_rate_percent=50, min_requests=10, window_s=10)


@pytest.mark.parametrize(
    ("results", "broken"),
    [
        ([False, False], False),
        ([False, False, False], True),  # three in a row
        ([False, False, True, False], False),  # a success resets the run
        ([True, False] * 5, True),  # 50% of 10
        ([True, True, False] * 3, False),  # 33% of 9
        ([True] * 9 + [False] * 2, False),  # 18%, and never 3 in a row
    ],
)
def test_route_counts_break_on_a_failure_run_or_an_error_rate(results, broken):
    counts = RouteCounts()
    for i, ok in enumerate(results):
        counts.add(ok, now=float(i) * 0.1, window_s=10)
    assert counts.broken(CONFIG) is broken


def test_old_results_leave_the_window():
    counts = RouteCounts()
    for i in range(10):
        counts.add(i % 2 == 0, now=float(i), window_s=5)
    assert len(counts.window) == 6  # times 4..9 are within 5 s of 9
    assert counts.failures_in_window == 3


D1 = DedicatedEndpoint(gpu_hour_usd=0, name="d1", base_url="http://d1/v1", model="x", max_concurrency=4)
S1 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s1", base_url="http://s1/v1", model="x")
S2 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s2", base_url="http://s2/v1", model="x")
MODEL = ModelConfig(dedicated=(D1,), serverless=(S1, S2))
CONTEXT = RequestContext("m", stream=False, stickiness_key="k")


@pytest.mark.parametrize(
    ("circuits", "targets", "reason"),
    [
        ({}, (D1, S1, S2), Reason.BASELINE),
        ({"m/d1": 15.0}, (S1, S2), Reason.CIRCUIT_OPEN),
        ({"m/d1": 9.0}, (D1, S1, S2), Reason.BASELINE),  # cooldown over: half-open, probe
        ({"m/s1": 15.0}, (D1, S2), Reason.CIRCUIT_OPEN),
        ({"other/d1": 15.0}, (D1, S1, S2), Reason.BASELINE),
        ({"m/d1": 30.0, "m/s1": 12.0, "m/s2": 20.0}, (S1,), Reason.CIRCUIT_OPEN),  # panic: soonest
    ],
)
def test_circuit_gate(circuits, targets, reason):
    decision = registry.build("dedicated_first", MODEL).decide(
        CONTEXT, Snapshot(now=10.0, circuit_open=circuits), MODEL.endpoints
    )
    assert (decision.targets, decision.reason) == (targets, reason)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest):
    if request.param == "memory":
        made = MemoryStore(["m/a"])
    else:
        made = RedisStore(request.getfixturevalue("redis_url"), [], routes=["m/a"])
    try:
        yield made
    finally:
        await made.close()


async def test_trips_double_the_cooldown_and_never_shorten_it(store):
    first = await store.circuits.trip("m/a", cooldown_s=1.0, max_cooldown_s=3.0)
    second = await store.circuits.trip("m/a", cooldown_s=1.0, max_cooldown_s=3.0)
    third = await store.circuits.trip("m/a", cooldown_s=1.0, max_cooldown_s=3.0)
    assert 0.9 <= first <= 1.0
    assert 1.9 <= second <= 2.0
    assert 2.9 <= third <= 3.0  # capped
    assert "m/a" in store.snapshot().circuit_open
    await store.circuits.reset_circuit("m/a")
    assert "m/a" not in store.snapshot().circuit_open
    assert 0.9 <= await store.circuits.trip("m/a", cooldown_s=1.0, max_cooldown_s=3.0) <= 1.0  # counting restarts


async def test_a_short_trip_does_not_cut_a_long_cooldown(store):
    await store.circuits.trip("m/a", cooldown_s=10.0, max_cooldown_s=60.0)
    await store.circuits.trip("m/a", cooldown_s=10.0, max_cooldown_s=60.0)  # 20 s
    left = await store.circuits.trip("m/a", cooldown_s=0.1, max_cooldown_s=0.1)
    assert left > 19


async def test_redis_circuits_are_seen_by_other_replicas(redis_url):
    a = RedisStore(redis_url, [], routes=["m/a"])
    b = RedisStore(redis_url, [], routes=["m/a"])
    try:
        await a.circuits.trip("m/a", cooldown_s=5.0, max_cooldown_s=5.0)
        await b.refresh()
        snapshot = b.snapshot()
        assert 4.0 < snapshot.circuit_open["m/a"] - snapshot.now <= 5.0
        await a.circuits.reset_circuit("m/a")
        await b.refresh()
        assert b.snapshot().circuit_open == {}
    finally:
        await a.close()
        await b.close()


def test_a_failing_dedicated_endpoint_is_skipped_then_tried_again():
    with Sim(dedicated_profile()) as ded, Sim(serverless_profile()) as sl:
        config = parse_config(
            "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
            "    breaker: {consecutive_failures: 2, cooldown_s: 0.3, max_cooldown_s: 0.3}\n"
            "    retry: {attempts: 2, backoff_ms: 0}\n"
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 4}}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n",
            {},
        )
        app = create_app(config)
        with ThreadServer(app) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)

            def call() -> tuple[str, str, str]:
                raw = client.chat.completions.with_raw_response.create(model="m", messages=[], max_tokens=1)
                h = raw.headers
                return h["x-tidegate-route"], h["x-tidegate-reason"], h["x-tidegate-attempts"]

            ded.configure(faults={"error_rate": 1.0})
            assert call() == ("sl", "failover", "2")
            assert call() == ("sl", "failover", "2")  # second failure in a row: the circuit opens
            wait_until(lambda: "m/ded" in app.state.store.snapshot().circuit_open, timeout=5)
            failed_before = ded.stats()["requests"]
            assert call() == ("sl", "circuit_open", "1")  # skipped: no attempt wasted on it
            assert ded.stats()["requests"] == failed_before
            ded.configure(faults={"error_rate": 0.0})
            # after the cooldown the next request probes dedicated, and its success closes it
            wait_until(lambda: call()[:2] == ("ded", "baseline"), timeout=10, interval=0.1)
            wait_until(lambda: "m/ded" not in app.state.store.snapshot().circuit_open, timeout=5)
