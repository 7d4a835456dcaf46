"""Acceptance for the live-signal policy steps, with real simulators and a real gateway:
the SLO guard, the vLLM engine signal, `fastest` serverless and the wait in line."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai

from router.app import create_app
from router.config import GatewayConfig, parse_config
from tests.conftest import serverless_profile
from tests.servers import Sim, ThreadServer, wait_until
from tidegate.sim.profile import Kind, SimProfile, TtftDistribution


def config(text: str) -> GatewayConfig:
    return parse_config(text, {})


def dedicated_route(name: str, sim: Sim, extra: str = "") -> str:
    return f"{{name: {name}, base_url: '{sim.base_url}', model: {name}, gpu_hour_usd: 0{extra}}}"


def serverless_route(name: str, sim: Sim) -> str:
    return f"{{name: {name}, base_url: '{sim.base_url}', model: {name}, usd_per_mtok_in: 0, usd_per_mtok_out: 0}}"


@contextmanager
def gateway(cfg: GatewayConfig) -> Iterator[openai.OpenAI]:
    with ThreadServer(create_app(cfg)) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30)


def stream(client: openai.OpenAI, user: str = "u", max_tokens: int = 2) -> tuple[str, str]:
    """One streamed chat request: (route, reason), after reading the whole answer."""
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, stream=True, user=user
    )
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text
    return raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"]


def send_until(client: openai.OpenAI, reason: str, *, limit: int, seconds: float) -> list[tuple[str, str]]:
    """Send streams one by one until one comes back with `reason` (bounded in count and time)."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + seconds
    while len(seen) < limit and time.monotonic() < deadline:
        seen.append(stream(client))
        if seen[-1][1] == reason:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no {reason!r} within {limit} requests / {seconds} s: {Counter(seen)}")


def test_slo_guard_spills_a_slow_dedicated_route_and_returns_when_it_recovers(redis_url):
    dedicated = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=8, itl_s=0.001, seed=1)
    with Sim(dedicated) as ded, Sim(serverless_profile()) as sl:
        cfg = config(
            f"state: {{redis_url: '{redis_url}', window_s: 10}}\n"
            "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
            # the SLO sits far from both TTFTs (~1 ms healthy, ~500 ms slowed), so a loaded
            # machine's scheduling delays cannot move a sample across it
            "    slo: {ttft_p95_ms: 250, min_samples: 5, dwell_s: 0, recover_ratio: 0.8}\n"
            f"    dedicated: [{dedicated_route('ded', ded, ', max_concurrency: 8')}]\n"
            f"    serverless: [{serverless_route('sl0', sl)}]\n"
        )
        with gateway(cfg) as client:
            healthy = [stream(client) for _ in range(5)]
            assert healthy == [("ded", "baseline")] * 5
            ded.configure(slowdown=500.0)  # TTFT from ~1 ms to ~500 ms: over the 250 ms SLO
            before = send_until(client, "slo_breach", limit=40, seconds=30)
            assert before[-1] == ("sl0", "slo_breach")
            assert before[0] == ("ded", "baseline")  # the guard needed evidence before it acted
            assert [stream(client) for _ in range(5)] == [("sl0", "slo_breach")] * 5
            ded.configure(slowdown=1.0)
            # the slow samples age out of the window (10-20 s); then dedicated is tried again
            after = send_until(client, "baseline", limit=1000, seconds=40)
            assert after[-1] == ("ded", "baseline")
            assert [stream(client) for _ in range(5)] == [("ded", "baseline")] * 5


def test_engine_signal_spills_when_vllm_reports_a_queue_from_other_clients():
    # the engine runs 2 sequences at once; the gateway's own slot count (16) would not stop it
    engine = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=2, itl_s=0.02, seed=1)
    with Sim(engine) as ded, Sim(serverless_profile()) as sl:
        signal = f"engine_signal: {{metrics_url: '{ded.url}/metrics', interval_s: 0.05, waiting_on: 1, dwell_s: 0}}"
        app = create_app(
            config(
                "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
                f"    dedicated: [{dedicated_route('ded', ded, ', max_concurrency: 16, ' + signal)}]\n"
                f"    serverless: [{serverless_route('sl0', sl)}]\n"
            )
        )
        with ThreadServer(app) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30)
            assert stream(client) == ("ded", "baseline")
            others = threading.Thread(target=direct_load, args=(ded, 6, 100))  # bypasses tidegate
            others.start()
            try:
                wait_until(lambda: "ded" in app.state.signals.engine_saturated, timeout=10)
                assert stream(client) == ("sl0", "saturated")
            finally:
                others.join(timeout=60)
            wait_until(lambda: not app.state.signals.engine_saturated, timeout=10)
            assert stream(client) == ("ded", "baseline")


def direct_load(sim: Sim, count: int, max_tokens: int) -> None:
    """`count` concurrent streams straight to a simulator, as other clients of the engine."""

    def one() -> None:
        body = {
            "model": "x",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        with httpx.stream("POST", sim.base_url + "/chat/completions", json=body, timeout=60) as r:
            for _ in r.iter_bytes():
                pass

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def test_fastest_moves_traffic_to_the_serverless_route_with_the_lower_p95_ttft():
    # a 200 ms TTFT (200 modelled seconds at FAST), against well under 1 ms quiet and ~30 ms on a
    # loaded machine for the other; its tokens stream at FAST like the other's
    slow = serverless_profile(seed=2, ttft=TtftDistribution(200.0, 0.1))
    with Sim(slow) as sl0, Sim(serverless_profile(seed=3)) as sl1:
        cfg = config(
            "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
            "    routing: {serverless: fastest, min_samples: 5, explore_percent: 50}\n"
            f"    serverless: [{serverless_route('sl0', sl0)}, {serverless_route('sl1', sl1)}]\n"
        )
        app = create_app(cfg)
        with ThreadServer(app) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30)

            def measured() -> bool:
                ttft = app.state.store.snapshot().ttft
                return all(ttft.get(f"m/sl{i}") and ttft[f"m/sl{i}"].samples >= 5 for i in (0, 1))

            # configured order first (sl0), then, once sl0 is measured, the explore share tries sl1
            # (the figures refresh every second: bounded by time, not only by count)
            warmup = Counter(stream(client, user=f"w{i}")[0] for i in range(5))
            deadline = time.monotonic() + 20
            for i in range(2000):
                if measured() or time.monotonic() > deadline:
                    break
                warmup[stream(client, user=f"x{i}")[0]] += 1
            assert measured(), warmup
            routes = Counter(stream(client, user=f"u{i}")[0] for i in range(20))
    assert warmup["sl0"] >= 5 and warmup["sl1"] >= 5
    assert routes == {"sl1": 20}, app.state.store.snapshot().ttft


def test_a_request_waits_in_line_for_a_dedicated_slot_when_allowed():
    dedicated = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=4, itl_s=0.02, seed=1)
    with Sim(dedicated) as ded, Sim(serverless_profile()) as sl:
        cfg = config(
            "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
            "    routing: {max_queue_ms: 5000}\n"
            f"    dedicated: [{dedicated_route('ded', ded, ', max_concurrency: 1')}]\n"
            f"    serverless: [{serverless_route('sl0', sl)}]\n"
        )
        with gateway(cfg) as client:
            first: list[tuple[str, str]] = []
            holder = threading.Thread(target=lambda: first.append(stream(client, max_tokens=30)))
            holder.start()
            wait_until(lambda: ded.stats()["in_flight"] == 1, timeout=10)
            second = stream(client)  # the pool is full: waits ~0.6 s for the slot
            holder.join(timeout=30)
            served_by_serverless = sl.stats()["requests"]
    assert first == [("ded", "baseline")]
    assert second == ("ded", "baseline")
    assert served_by_serverless == 0
