"""Priority classes from outside (issue 30): a batch key's backlog fills the dedicated pool
but its last reserved slot, never spills to serverless, and waits behind interactive
requests; past its wait it is refused (503, Retry-After); the routes report shows what batch
added to the pool's utilization and the serverless spend it avoided."""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.servers import CliProcess, Sim, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

ADMIN = "prio-admin"
BATCH, USER = "sk-batch-1", "sk-user-1"
CAPACITY = 4


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def write_config(path: Path, ded: Sim, sl: Sim, redis_url: str, on_timeout: str = "reject") -> Path:
    path.write_text(
        f"state: {{redis_url: '{redis_url}'}}\n"
        f"auth:\n  admin_key: {ADMIN}\n  keys:\n"
        f"    - {{name: nightly, team: bi, priority: batch, key_sha256: {digest(BATCH)}}}\n"
        f"    - {{name: app, team: web, key_sha256: {digest(USER)}}}\n"
        "models:\n  m:\n"
        f"    routing: {{batch: {{max_wait_s: 30, reserve_slots: 1, on_timeout: {on_timeout}}}}}\n"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: {CAPACITY}}}]\n"
        f"    serverless: [{{name: sl, base_url: '{sl.base_url}', model: s, usd_per_mtok_in: 1.0,"
        " usd_per_mtok_out: 2.0}]\n"
    )
    return path


@pytest.fixture
def sims():
    slow = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.02, seed=1)
    sl = SimProfile(kind=Kind.SERVERLESS, name="sl", ttft=SERVERLESS_PRESETS["fast"], time_scale=10.0)
    with Sim(slow) as d, Sim(sl) as s:
        yield d, s


def ask(url: str, key: str, max_tokens: int = 25, **headers: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    headers = {"authorization": f"Bearer {key}"} | {k.replace("_", "-"): v for k, v in headers.items()}
    return httpx.post(url + "/chat/completions", json=body, headers=headers, timeout=60)


def in_flight(root: str) -> int:
    found = httpx.get(root + "/admin/models/m", headers={"authorization": f"Bearer {ADMIN}"}).json()
    return found["dedicated"][0]["in_flight"]


def routes(root: str) -> dict:
    report = httpx.get(root + "/admin/routes", headers={"authorization": f"Bearer {ADMIN}"}).json()
    return report["models"]["m"]["routes"]["ded"]


@pytest.mark.timeout(120)
def test_a_batch_backlog_keeps_a_slot_free_never_spills_and_interactive_stays_on_dedicated(
    tmp_path, sims, redis_url
):
    ded, sl = sims
    config = write_config(tmp_path / "p.yaml", ded, sl, redis_url)
    peak = {"ded": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak["ded"] = max(peak["ded"], ded.stats()["running"])
            stop.wait(0.01)

    with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
        watcher = threading.Thread(target=watch)
        watcher.start()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            backlog = [pool.submit(ask, gw.url, BATCH) for _ in range(12)]
            wait_until(lambda: ded.stats()["running"] == CAPACITY - 1, timeout=10)
            interactive = []
            for _ in range(5):  # one at a time, each once the last one's slot is given back
                wait_until(lambda: in_flight(gw.root) < CAPACITY, timeout=5, interval=0.02)
                interactive.append(ask(gw.url, USER, max_tokens=2))
            batch = [f.result() for f in backlog]
        stop.set()
        watcher.join()
        wait_until(
            lambda: (routes(gw.root).get("batch") or {}).get("requests") == 12, timeout=10, interval=0.1
        )
        pool_entry = routes(gw.root)
        sl_requests = sl.stats()["requests"]
    assert Counter(r.status_code for r in batch) == {200: 12}
    assert {r.headers["x-tidegate-route"] for r in batch} == {"ded"}, "batch never spills"
    assert sl_requests == 0
    assert [r.headers["x-tidegate-route"] for r in interactive] == ["ded"] * 5, "the reserved slot"
    assert peak["ded"] <= CAPACITY
    assert pool_entry["batch"]["avoided_serverless_usd"] > 0
    assert pool_entry["utilization"] > pool_entry["utilization_without_batch"] >= 0


def test_a_batch_request_past_its_deadline_is_refused_or_spills_as_configured(tmp_path, sims, redis_url):
    ded, sl = sims
    for on_timeout in ("reject", "spill"):
        config = write_config(tmp_path / f"{on_timeout}.yaml", ded, sl, redis_url, on_timeout)
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as gw,
            concurrent.futures.ThreadPoolExecutor(8) as pool,
        ):
            hold = [pool.submit(ask, gw.url, BATCH, 100) for _ in range(CAPACITY - 1)]
            wait_until(lambda: ded.stats()["running"] == CAPACITY - 1, timeout=10)
            started = time.monotonic()
            late = ask(gw.url, BATCH, x_tidegate_deadline_ms="300")
            waited = time.monotonic() - started
            bad = ask(gw.url, BATCH, x_tidegate_deadline_ms="soon")
            marked = ask(gw.url, USER, 2, x_tidegate_priority="batch", x_tidegate_deadline_ms="200")
            for f in hold:
                f.result()
        if on_timeout == "reject":
            assert late.status_code == 503 and "retry-after" in late.headers, late.text
            assert marked.status_code == 503, "an interactive key may mark its own request batch"
        else:
            assert late.status_code == 200 and late.headers["x-tidegate-route"] == "sl"
        assert waited >= 0.3
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-tidegate-deadline-ms"
