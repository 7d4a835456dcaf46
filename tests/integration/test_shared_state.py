"""Acceptance for shared state: separate gateway processes, one real Redis, real simulators."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from pathlib import Path

import httpx
import openai

from tests.servers import CliProcess, RedisServer, Sim, run_cli, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

CAPACITY = 4


def write_config(path: Path, ded: Sim, sl: Sim, redis_url: str, lease_ttl_s: float = 30.0) -> Path:
    path.write_text(
        f"state: {{redis_url: '{redis_url}', lease_ttl_s: {lease_ttl_s}}}\n"
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: {CAPACITY}}}]\n"
        f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
    )
    return path


def slow_dedicated() -> SimProfile:
    return SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.02, seed=1)


def serverless() -> SimProfile:
    return SimProfile(
        kind=Kind.SERVERLESS, name="sl", ttft=SERVERLESS_PRESETS["fast"], serverless_itl_s=0.002
    )


def burst(urls: list[str], count: int, max_tokens: int) -> list[tuple[str, str, str]]:
    """`count` concurrent streams spread round-robin over the gateways: (route, reason, text)."""
    results: list[tuple[str, str, str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(count)

    def one(i: int) -> None:
        client = openai.OpenAI(base_url=urls[i % len(urls)], api_key="x", max_retries=0, timeout=60)
        start.wait()
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, stream=True
            )
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            with lock:
                results.append((raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"], text))
        except BaseException as exc:  # collected and asserted below
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


def test_two_gateway_processes_share_dedicated_capacity(tmp_path, redis_url):
    with Sim(slow_dedicated()) as ded, Sim(serverless()) as sl:
        config = write_config(tmp_path / "t.yaml", ded, sl, redis_url)
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as a,
            CliProcess("serve", "--config", str(config), "--port", "0") as b,
        ):
            results = burst([a.url, b.url], count=24, max_tokens=20)
        ded_stats, sl_stats = ded.stats(), sl.stats()
    assert len(results) == 24
    assert all(text for _, _, text in results), "every request got its answer"
    assert ded_stats["max_in_flight"] <= CAPACITY  # the simulator's own counter
    routes = Counter((route, reason) for route, reason, _ in results)
    assert set(routes) <= {("ded", "baseline"), ("sl", "saturated")}
    assert routes[("ded", "baseline")] == ded_stats["completed"] >= CAPACITY
    assert routes[("sl", "saturated")] == sl_stats["completed"] >= 24 - 2 * CAPACITY


def test_a_killed_replica_frees_its_slots_after_the_lease_ttl(tmp_path, redis_server: RedisServer):
    redis_server.flush()
    with Sim(slow_dedicated()) as ded, Sim(serverless()) as sl:
        config = write_config(tmp_path / "t.yaml", ded, sl, redis_server.url, lease_ttl_s=1.5)
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as doomed,
            CliProcess("serve", "--config", str(config), "--port", "0") as survivor,
        ):
            holders = [threading.Thread(target=_hold_stream, args=(doomed.url,)) for _ in range(CAPACITY)]
            for t in holders:
                t.start()
            wait_until(lambda: ded.stats()["running"] == CAPACITY, timeout=15)
            assert _route_via(survivor.url) == ("sl", "saturated")
            doomed.stop(signal.SIGKILL)
            wait_until(lambda: _route_via(survivor.url)[0] == "ded", timeout=15, interval=0.1)
            results = burst([survivor.url], count=CAPACITY, max_tokens=5)
            assert [route for route, _, _ in results] == ["ded"] * CAPACITY, "full capacity is usable again"
            for t in holders:
                t.join(timeout=30)


def _hold_stream(url: str) -> None:
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
    try:
        for _ in client.chat.completions.create(model="m", messages=[], max_tokens=3000, stream=True):
            pass
    except openai.APIError:
        pass  # its gateway was killed under it: that is the point


def _route_via(url: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[], max_tokens=1)
    return raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"]


def test_canary_set_through_one_replica_is_obeyed_by_the_other(tmp_path, redis_url):
    with Sim(slow_dedicated()) as ded, Sim(serverless()) as sl:
        config = write_config(tmp_path / "t.yaml", ded, sl, redis_url)
        config.write_text(
            config.read_text().replace(
                "auth: {allow_anonymous: true}", "auth: {allow_anonymous: true, admin_key: adm}"
            )
        )
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as a,
            CliProcess("serve", "--config", str(config), "--port", "0") as b,
        ):
            assert _route_via(b.url) == ("ded", "baseline")
            put = httpx.put(
                a.root + "/admin/models/m/canary",
                json={"percent": 0},
                headers={"authorization": "Bearer adm"},
            )
            assert put.status_code == 200
            wait_until(lambda: _route_via(b.url) == ("sl", "canary_out"), timeout=10, interval=0.05)
            seen = httpx.get(b.root + "/admin/models/m", headers={"authorization": "Bearer adm"}).json()
            assert seen["canary_percent"] == 0 and seen["state_store"] == "redis"


def test_workers_of_one_serve_process_share_capacity_through_redis(tmp_path, redis_url):
    with Sim(slow_dedicated()) as ded, Sim(serverless()) as sl:
        config = write_config(tmp_path / "t.yaml", ded, sl, redis_url)
        with CliProcess("serve", "--config", str(config), "--port", "0", "--workers", "2") as gw:
            assert "workers: 2" in "".join(gw.output)
            results = burst([gw.url], count=16, max_tokens=20)
            code = gw.stop()
        ded_stats = ded.stats()
    assert code == 0, "".join(gw.output)
    assert all(text for _, _, text in results)
    assert ded_stats["max_in_flight"] <= CAPACITY
    assert Counter(reason for _, reason, _ in results)["saturated"] >= 16 - 2 * CAPACITY


def test_workers_without_redis_are_refused(tmp_path):
    with Sim(slow_dedicated()) as ded, Sim(serverless()) as sl:
        config = write_config(tmp_path / "t.yaml", ded, sl, "")
        done = run_cli("serve", "--config", str(config), "--port", "0", "--workers", "2")
    assert done.returncode == 2
    assert "redis_url" in done.stderr
