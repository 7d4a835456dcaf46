"""The multi-replica rehearsal without Kubernetes: three `tidegate serve` processes with the
same config and one real redis-server, behind a round-robin client, as the Helm chart runs
them (see helm/). Global capacity holds, a canary set through one replica is obeyed by all,
and /admin/routes gives the same answer from each."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path

import httpx
import openai

from tests.conftest import serverless_profile
from tests.servers import CliProcess, Sim, wait_until
from tidegate.sim.profile import Kind, SimProfile

CAPACITY = 3
ADMIN = {"authorization": "Bearer adm"}


def test_three_replicas_behave_as_one_gateway(tmp_path: Path, redis_url):
    dedicated = SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=32, itl_s=0.01, seed=1)
    with Sim(dedicated) as ded, Sim(serverless_profile()) as sl:
        config = tmp_path / "tidegate.yaml"
        config.write_text(
            f"state: {{redis_url: '{redis_url}'}}\nauth: {{admin_key: adm, allow_anonymous: true}}\n"
            "models:\n  m:\n"
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: {CAPACITY}}}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
        )
        replicas = [CliProcess("serve", "--config", str(config), "--port", "0") for _ in range(3)]
        for r in replicas:
            r.__enter__()
        try:
            urls = itertools.cycle([r.url for r in replicas])
            lock = threading.Lock()
            routes: Counter[tuple[str, str]] = Counter()
            errors: list[BaseException] = []
            start = threading.Barrier(18)

            def one(url: str, user: str) -> None:
                client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
                start.wait(timeout=10)
                try:
                    raw = client.chat.completions.with_raw_response.create(
                        model="m", messages=[], max_tokens=40, stream=True, user=user
                    )
                    list(raw.parse())
                    with lock:
                        routes[(raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"])] += 1
                except BaseException as exc:  # asserted below
                    with lock:
                        errors.append(exc)

            threads = [threading.Thread(target=one, args=(next(urls), f"u{i}")) for i in range(18)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not errors, errors
            assert ded.stats()["max_in_flight"] <= CAPACITY  # global, across the three
            assert routes[("sl", "saturated")] >= 18 - 3 * CAPACITY

            # a canary set through one replica is obeyed by all three
            put = httpx.put(replicas[0].root + "/admin/models/m/canary", json={"percent": 0}, headers=ADMIN)
            assert put.status_code == 200

            probes = []

            def routed_by(replica: CliProcess) -> tuple[str, str]:
                probes.append(replica)
                client = openai.OpenAI(base_url=replica.url, api_key="x", max_retries=0)
                raw = client.chat.completions.with_raw_response.create(model="m", messages=[], max_tokens=1)
                return raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"]

            for replica in replicas:
                wait_until(lambda r=replica: routed_by(r) == ("sl", "canary_out"), timeout=10, interval=0.05)

            # /admin/routes agrees across replicas once every replica has flushed
            def report(replica: CliProcess) -> dict:
                return httpx.get(replica.root + "/admin/routes?window=5m", headers=ADMIN).json()["models"][
                    "m"
                ]

            sent = 18 + len(probes)

            def settled() -> bool:
                found = [report(r) for r in replicas]
                tasks = {sum(e["tasks"] for e in f["economics"]["routes"].values()) for f in found}
                return all(f["requests"] == sent for f in found) and tasks == {sent}

            wait_until(settled, timeout=10, interval=0.2)
            reports = [report(r) for r in replicas]
        finally:
            for r in replicas:
                r.__exit__(None, None, None)
    # utilization and dedicated cost divide or multiply by the time the window spans *now*, so
    # they move between the calls; tasks and serverless costs must agree exactly
    utilization = [r["routes"]["ded"].pop("utilization") for r in reports]
    assert max(utilization) - min(utilization) < 0.01
    economics = [r.pop("economics") for r in reports]
    assert reports[0] == reports[1] == reports[2]
    for route in ("ded", "sl"):
        for figure in ("tasks", "successful_tasks", "successful_requests"):
            assert len({e["routes"][route][figure] for e in economics}) == 1, (route, figure)
    assert len({e["routes"]["sl"]["cost_usd"] for e in economics}) == 1
    assert reports[0]["routes"]["ded"]["requests"] + reports[0]["routes"]["sl"]["requests"] == sent
    assert reports[0]["spill_rate"]["canary_out"] > 0
