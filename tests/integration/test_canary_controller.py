"""Acceptance for the canary controller (issue 15): real simulators, a real Redis, gateway
processes, the official SDK as the traffic. Intervals are short (1-2 s) so runs finish in
seconds; the analysis reads whole 10 s slices, so it also sees some of the previous interval."""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.servers import CliProcess, Sim, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

ADMIN = {"authorization": "Bearer canary-admin"}


def write_config(path: Path, ded: Sim, sl: Sim, redis_url: str, **canary: Any) -> Path:
    settings = {
        "steps": "[10, 25, 50, 100]",
        "interval_s": 1,
        "min_samples": 5,
        "failure_threshold": 2,
    } | canary
    block = ", ".join(f"{k}: {v}" for k, v in settings.items())
    path.write_text(
        f"state: {{redis_url: '{redis_url}', leader_ttl_s: 2}}\n"
        "auth: {allow_anonymous: true, admin_key: canary-admin}\n"
        "models:\n  m:\n"
        "    canary_percent: 0\n"
        "    retry: {attempts: 2, backoff_ms: 1, budget_percent: 100}\n"
        "    breaker: {consecutive_failures: 100000, min_requests: 100000}\n"
        f"    canary: {{{block}, checks: {{ttft_p95_max_ratio: 3, itl_p50_max_ratio: 3, e2e_per_token_p95_max_ratio: 3,"
        " error_rate_max_percent: 5, success_rate_min_ratio: 0.9}}\n"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 64}}]\n"
        f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
    )
    return path


def sims(**dedicated: Any) -> tuple[SimProfile, SimProfile]:
    return (
        SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=128, itl_s=0.003, seed=1, **dedicated),
        SimProfile(
            kind=Kind.SERVERLESS, name="sl", ttft=SERVERLESS_PRESETS["fast"], serverless_itl_s=0.004, seed=2
        ),
    )


@contextmanager
def traffic(urls: list[str], threads: int = 4, pause_s: float = 0.0, stream: bool = True) -> Iterator[None]:
    """Streams (or, `stream=False`, plain answers) from many users (stickiness keys) until the
    block ends (at most 120 s)."""
    stop = threading.Event()
    deadline = time.monotonic() + 120

    def run(n: int) -> None:
        client = openai.OpenAI(base_url=urls[n % len(urls)], api_key="x", max_retries=0, timeout=30)
        rng = random.Random(n)
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                answer = client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "hi"}],
                    stream=stream,
                    user=f"u{rng.random()}",
                )
                if stream:
                    for _ in answer:
                        pass
            except openai.APIError:
                pass  # a replica being killed: the test asserts on the controller, not on this
            if pause_s:
                stop.wait(pause_s)

    workers = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(threads)]
    for w in workers:
        w.start()
    try:
        yield
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=35)


def status(gateway: CliProcess) -> dict[str, Any]:
    answer = httpx.get(gateway.root + "/admin/models/m/canary?history=200", headers=ADMIN, timeout=10)
    answer.raise_for_status()
    return answer.json()


def act(gateway: CliProcess, action: str) -> httpx.Response:
    return httpx.post(gateway.root + f"/admin/models/m/canary/{action}", headers=ADMIN, timeout=10)


def events(found: dict[str, Any]) -> list[dict[str, Any]]:
    return list(reversed(found["history"]))  # oldest first


TERMINAL = frozenset({"promoted", "rolled_back"})


def wait_state(gateway: CliProcess, state: str, timeout: float) -> dict[str, Any]:
    """The run's status once it is in `state`; a failure naming the state it ended in instead."""
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen.update(status(gateway))
        now = seen["run"]["state"]
        assert now == state or now not in TERMINAL, f"the run ended {now}, not {state}: {events(seen)[-3:]}"
        return now == state

    wait_until(reached, timeout=timeout, interval=0.2)
    return status(gateway)


@pytest.mark.timeout(150)
def test_a_healthy_run_walks_every_step_and_survives_its_leader_being_killed(tmp_path, redis_url):
    ded_profile, sl_profile = sims()
    with Sim(ded_profile) as ded, Sim(sl_profile) as sl:
        config = write_config(
            tmp_path / "c.yaml", ded, sl, redis_url, steps="[10, 30, 60, 100]", interval_s=2
        )
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as a,
            CliProcess("serve", "--config", str(config), "--port", "0") as b,
            traffic([a.url, b.url]),
        ):
            assert act(b, "start").status_code == 200
            wait_until(lambda: status(b)["run"]["step"] >= 1, timeout=40, interval=0.2)
            leader = a if status(a)["this_replica"]["leading"] else b
            survivor = b if leader is a else a
            killed_token = status(leader)["this_replica"]["token"]
            step_at_kill = status(survivor)["run"]["step"]
            leader.stop(signal.SIGKILL)
            killed_at = time.time()
            found = wait_state(survivor, "promoted", timeout=60)
    history = events(found)
    steps = [e for e in history if e["action"] in ("step_up", "promote")]
    assert [e["percent"] for e in steps] == [30, 60, 100]  # every step, in order
    for earlier, later in itertools.pairwise(steps):
        assert later["at"] - earlier["at"] >= 2 * 0.9, "two steps in one interval"
        assert later["percent_before"] == earlier["percent"]
    after_kill = [e for e in steps if e["at"] > killed_at]
    assert after_kill and all(e["by"] == found["this_replica"]["token"] for e in after_kill)
    assert all(e["by"] != killed_token for e in after_kill)
    assert after_kill[0]["percent_before"] >= [10, 30, 60, 100][step_at_kill]  # continued, not restarted
    assert after_kill[0]["at"] - killed_at < 2 + 2 + 3  # lease TTL + one interval + a tick's slack
    assert found["live_percent"] == 100


@pytest.mark.timeout(150)
def test_a_healthy_run_promotes_on_non_streaming_traffic_alone(tmp_path, redis_url):
    """No request streams, so there is no TTFT or ITL: e2e per output token is the latency
    compared, and the TTFT and ITL checks are skipped, not missing."""
    ded_profile, sl_profile = sims()
    with Sim(ded_profile) as ded, Sim(sl_profile) as sl:
        config = write_config(tmp_path / "c.yaml", ded, sl, redis_url, steps="[10, 50, 100]", interval_s=2)
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw, traffic([gw.url], stream=False):
            assert act(gw, "start").status_code == 200
            found = wait_state(gw, "promoted", timeout=90)
    assert found["live_percent"] == 100
    promoted = events(found)[-1]
    results = {c["name"]: c["result"] for c in promoted["analysis"]["checks"]}
    assert results["e2e_per_token_p95_ratio"] == "pass"
    assert results["ttft_p95_ratio"] == results["itl_p50_ratio"] == "skipped"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("change", "failing_check", "stream"),
    [
        ({"slowdown": 40}, {"ttft_p95_ratio", "itl_p50_ratio", "e2e_per_token_p95_ratio"}, True),
        ({"slowdown": 40}, {"e2e_per_token_p95_ratio"}, False),  # no stream: the e2e check sees it
        ({"faults": {"error_rate": 0.6}}, {"error_rate_percent"}, True),
    ],
    ids=["slowed-down", "slowed-down-non-streaming", "erroring"],
)
def test_a_degrading_dedicated_is_rolled_back(tmp_path, redis_url, change, failing_check, stream):
    ded_profile, sl_profile = sims()
    with Sim(ded_profile) as ded, Sim(sl_profile) as sl:
        steps = "[10, 20, 30, 40, 50, 60, 70, 80, 90, 100]"  # room to fail before the end
        # a step at most every 3 s: the run cannot walk its last nine steps (27 s) before the
        # slowdown fills the analysis's 10 s slices and two analyses fail, however loaded the
        # machine (a loaded one gives fewer samples, so it holds rather than steps)
        config = write_config(tmp_path / "c.yaml", ded, sl, redis_url, steps=steps, interval_s=3)
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as gw,
            traffic([gw.url], stream=stream),
        ):
            assert act(gw, "start").status_code == 200
            wait_until(lambda: status(gw)["run"]["step"] >= 1, timeout=40, interval=0.2)
            ded.configure(**change)
            # ~20 s alone (the analysis reads whole 10 s slices, so the slowdown has to fill
            # them); a deadline, not a speed claim: once in a loaded full run it took over 60 s
            found = wait_state(gw, "rolled_back", timeout=120)
    assert found["live_percent"] == 0
    rollback = events(found)[-1]
    assert rollback["action"] == "rollback" and rollback["percent"] == 0
    failed = [c for c in rollback["analysis"]["checks"] if c["result"] == "fail"]
    assert failing_check & {c["name"] for c in failed}
    for check in failed:  # each failing check shows the figures that failed it
        assert check["dedicated"] is not None
        ratio = check["dedicated"] / (check["serverless"] or 1)
        assert ratio < check["limit"] if check["name"] == "success_rate_ratio" else ratio > check["limit"]
    fails = [e for e in events(found) if e["verdict"] == "fail"]
    assert len(fails) >= 2  # failure_threshold failed analyses in a row


@pytest.mark.timeout(90)
def test_thin_traffic_holds_and_never_steps_up(tmp_path, redis_url):
    ded_profile, sl_profile = sims()
    with Sim(ded_profile) as ded, Sim(sl_profile) as sl:
        config = write_config(tmp_path / "c.yaml", ded, sl, redis_url, min_samples=500)
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as gw,
            traffic([gw.url], threads=1, pause_s=0.2),
        ):
            assert act(gw, "start").status_code == 200
            wait_until(
                lambda: sum(e["action"] == "hold" for e in status(gw)["history"]) >= 4,
                timeout=40,
                interval=0.2,
            )
            found = status(gw)
    assert found["run"]["state"] == "progressing" and found["run"]["step"] == 0
    holds = [e for e in events(found) if e["action"] == "hold"]
    assert all(e["verdict"] == "inconclusive" and "too few requests" in e["reason"] for e in holds)
    assert not any(e["action"] in ("step_up", "promote") for e in events(found))


@pytest.mark.timeout(90)
def test_a_manual_set_pauses_the_run_and_admin_actions_are_checked(tmp_path, redis_url):
    ded_profile, sl_profile = sims()
    with Sim(ded_profile) as ded, Sim(sl_profile) as sl:
        config = write_config(tmp_path / "c.yaml", ded, sl, redis_url, interval_s=30)
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            assert act(gw, "pause").status_code == 409  # nothing to pause yet
            assert act(gw, "start").status_code == 200
            assert act(gw, "start").status_code == 409  # already running
            assert act(gw, "bogus").status_code == 400
            manual = httpx.put(gw.root + "/admin/models/m/canary", json={"percent": 40}, headers=ADMIN)
            assert manual.status_code == 200
            found = status(gw)
            resumed = act(gw, "resume").json()
            aborted = act(gw, "abort").json()
    assert found["run"]["state"] == "paused" and found["live_percent"] == 40
    assert events(found)[-1]["action"] == "manual_set" and "by hand" in events(found)[-1]["reason"]
    assert resumed["run"]["state"] == "progressing" and resumed["live_percent"] == 10  # back on its plan
    assert aborted["run"]["state"] == "rolled_back" and aborted["live_percent"] == 0


@pytest.mark.timeout(200)
def test_an_enforced_parity_verdict_holds_the_run_until_dedicated_is_at_parity(tmp_path, redis_url):
    ded_profile, sl_profile = sims()
    with Sim(ded_profile) as ded, Sim(sl_profile) as sl:
        config = write_config(tmp_path / "c.yaml", ded, sl, redis_url, interval_s=1)
        config.write_text(
            config.read_text().replace(
                "    canary_percent: 0\n", "    canary_percent: 0\n    parity: {enforce: true}\n"
            )
        )
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw, traffic([gw.url]):
            diverges = {"at": "t", "endpoints": {"ded": {"verdict": "diverges", "why": "tool calls"}}}
            put = httpx.put(gw.root + "/admin/models/m/parity", json=diverges, headers=ADMIN, timeout=10)
            assert put.status_code == 200, put.text
            assert act(gw, "start").status_code == 200
            # A hold for parity, not only for want of requests: on a loaded machine the first
            # holds may all be "too few requests" before the slices fill.
            wait_until(
                lambda: any(
                    e["action"] == "hold" and "parity" in (e["reason"] or "") for e in events(status(gw))
                ),
                timeout=90,
                interval=0.2,
            )
            held = status(gw)
            at_parity = {"at": "t2", "endpoints": {"ded": {"verdict": "parity"}, "sl": {"verdict": "parity"}}}
            assert (
                httpx.put(gw.root + "/admin/models/m/parity", json=at_parity, headers=ADMIN).status_code
                == 200
            )
            wait_until(lambda: status(gw)["run"]["step"] >= 1, timeout=60, interval=0.2)
    holds = [e for e in events(held) if e["action"] == "hold"]
    assert held["run"]["step"] == 0 and not [e for e in events(held) if e["action"] == "step_up"]
    parity_holds = [e for e in holds if "parity" in (e["reason"] or "")]
    assert parity_holds, [e["reason"] for e in holds]
    checks = {c["name"]: c["result"] for c in parity_holds[-1]["analysis"]["checks"]}
    assert checks["parity"] == "fail"
