"""`tidegate parity` from outside (issue 29): the example suite against a faithful dedicated
simulator, a faithful serverless one and a `tool-drift` one, through the CLI; `--apply` with
`parity.enforce` on two gateway replicas sharing a real Redis; a burst then spills only to the
faithful serverless endpoint, on both replicas."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from tests.servers import CliProcess, Sim, run_cli, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, Persona, SimProfile

SUITE = Path(__file__).parents[2] / "examples" / "parity-suite.jsonl"
ADMIN = "parity-admin"
CAPACITY = 2


def dedicated() -> SimProfile:
    return SimProfile(kind=Kind.DEDICATED, name="ded", max_concurrency=64, itl_s=0.02, seed=1)


def serverless(name: str, persona: Persona = Persona.FAITHFUL, share: float = 0.0) -> SimProfile:
    return SimProfile(
        kind=Kind.SERVERLESS,
        name=name,
        ttft=SERVERLESS_PRESETS["fast"],
        serverless_itl_s=0.002,
        seed=1,
        persona=persona,
        persona_share=share,
    )


def write_config(path: Path, sims: dict[str, Sim], *, redis_url: str = "", enforce: bool = True) -> Path:
    state = f"state: {{redis_url: '{redis_url}'}}\n" if redis_url else ""
    ded = sims["ded"]
    path.write_text(
        state
        + f"auth: {{allow_anonymous: true, admin_key: {ADMIN}}}\nmodels:\n  m:\n"
        + f"    parity: {{enforce: {str(enforce).lower()}}}\n"
        + f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: {CAPACITY}}}]\n"
        + "    serverless:\n"
        + "".join(  # the drifting endpoint first: without parity it would take every spill
            f"      - {{name: {name}, base_url: '{sim.base_url}', model: s, usd_per_mtok_in: 0.2,"
            " usd_per_mtok_out: 0.6}\n"
            for name, sim in sims.items()
            if name != "ded"
        )
    )
    return path


def parity(config: Path, out: Path, *extra: str):
    return run_cli(
        "parity", "--config", str(config), "--model", "m", "--suite", str(SUITE), "--out", str(out), *extra
    )


@pytest.fixture
def sims():
    with (
        Sim(dedicated()) as ded,
        Sim(serverless("drift", Persona.TOOL_DRIFT, share=0.7)) as drift,
        Sim(serverless("good")) as good,
    ):
        yield {"ded": ded, "drift": drift, "good": good}


def test_the_drifting_endpoint_diverges_with_its_failing_cases_named(tmp_path, sims):
    config = write_config(tmp_path / "p.yaml", sims)
    done = parity(config, tmp_path / "out", "--html")
    assert done.returncode == 3, done.stdout + done.stderr  # an endpoint diverges: CI can gate on it
    found = orjson.loads((tmp_path / "out" / "parity.json").read_bytes())
    verdicts = {e["endpoint"]: e for e in found["endpoints"]}
    assert found["reference"] == "ded"
    assert verdicts["ded"]["verdict"] == "reference"
    assert verdicts["good"]["verdict"] == "parity", verdicts["good"]
    assert verdicts["good"]["pass_rate"] == 1.0 and verdicts["good"]["agreement"] == 1.0
    assert verdicts["drift"]["verdict"] == "diverges", verdicts["drift"]
    tool_cases = {"weather-call", "lookup-order", "schedule-call"}
    assert verdicts["drift"]["failed_cases"], "the failing cases are named"
    assert set(verdicts["drift"]["failed_cases"]) <= tool_cases  # tool-drift touches tool calls only
    for case in verdicts["drift"]["failed_cases"]:
        cell = found["cases"][case]["drift"]
        assert cell["passed"] == 0 and cell["repeats"] == 3, cell  # a drifting request drifts each repeat
        assert any(how.startswith("tool_call:") for how in cell["how"]), cell
    assert "drift diverges" in done.stdout
    assert "weather-call" in (tmp_path / "out" / "parity.html").read_text()
    again = parity(config, tmp_path / "again")
    compared = run_cli("parity", "--compare", str(tmp_path / "out"), str(tmp_path / "again"))
    assert again.returncode == 3 and compared.returncode == 0, compared.stderr
    repeat = orjson.loads((tmp_path / "again" / "parity.json").read_bytes())
    assert repeat["cases"] == found["cases"], "seeded personas: the same run gives the same matrix"


def test_a_run_over_the_dollar_cap_is_refused_without_a_terminal(tmp_path, sims):
    config = write_config(tmp_path / "p.yaml", sims)
    done = parity(config, tmp_path / "out", "--max-usd", "0.000001")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "over --max-usd" in done.stdout and "--yes" in done.stderr
    assert sims["good"].stats()["requests"] == 0 and not (tmp_path / "out").exists()


def test_a_bad_suite_line_is_refused_with_its_line_and_key(tmp_path, sims):
    config = write_config(tmp_path / "p.yaml", sims)
    suite = tmp_path / "bad.jsonl"
    suite.write_text(
        '{"id": "a", "request": {"messages": []}}\n{"id": "b", "request": {"messages": []}, "expect": {"regx": "x"}}\n'
    )
    done = run_cli("parity", "--config", str(config), "--model", "m", "--suite", str(suite))
    assert done.returncode == 2
    assert f"{suite}:2" in done.stderr and "expect.regx" in done.stderr


@pytest.mark.timeout(120)
def test_apply_with_enforce_takes_the_drifting_endpoint_out_of_both_replicas_spill_order(
    tmp_path, sims, redis_url
):
    config = write_config(tmp_path / "p.yaml", sims, redis_url=redis_url)
    with (
        CliProcess("serve", "--config", str(config), "--port", "0") as a,
        CliProcess("serve", "--config", str(config), "--port", "0") as b,
    ):
        assert {route for route, _ in burst([a.url, b.url], 12)} >= {"drift"}  # before: drift takes spills
        drift_before = sims["drift"].stats()["requests"]
        done = parity(config, tmp_path / "out", "--apply", a.root, "--admin-key", ADMIN)
        assert done.returncode == 3, done.stdout + done.stderr
        assert "applied the verdicts" in done.stdout
        for replica in (a, b):  # the other replica learns it through Redis
            wait_until(lambda r=replica: _excluded(r.root) == {"drift"}, timeout=10, interval=0.1)
        routes = Counter(burst([a.url, b.url], 16))
        stats = run_cli("stats", "--url", b.root, "--admin-key", ADMIN)
    assert set(routes) <= {("ded", "baseline"), ("good", "saturated")}, routes
    assert routes[("good", "saturated")] >= 16 - 2 * CAPACITY
    cases = len(SUITE.read_text().splitlines())
    assert sims["drift"].stats()["requests"] == drift_before + 3 * cases, "only the parity run's own requests"
    assert "parity_diverges" in stats.stdout


def _excluded(root: str) -> set[str]:
    routes = httpx.get(f"{root}/admin/routes", headers={"authorization": f"Bearer {ADMIN}"}).json()
    return {
        name
        for name, route in routes["models"]["m"]["routes"].items()
        if (route.get("parity") or {}).get("excluded")
    }


def burst(urls: list[str], count: int) -> list[tuple[str, str]]:
    """`count` concurrent streams over the gateways, round-robin: (route, reason) of each."""
    results: list[tuple[str, str]] = []
    lock, start = threading.Lock(), threading.Barrier(count)

    def one(i: int) -> None:
        client = openai.OpenAI(base_url=urls[i % len(urls)], api_key="x", max_retries=0, timeout=60)
        start.wait()
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=30, stream=True
        )
        for _ in raw.parse():
            pass
        with lock:
            results.append((raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == count
    return results
