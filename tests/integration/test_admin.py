"""The admin API and `tidegate canary set`, against a running gateway."""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from router.app import create_app
from tests.conftest import gateway_config
from tests.servers import Sim, ThreadServer, run_cli, wait_until

ADMIN = {"authorization": "Bearer admin-secret"}


@pytest.fixture
def admin_gateway(dedicated_sim: Sim, serverless_sims: list[Sim]) -> Iterator[ThreadServer]:
    config = gateway_config(dedicated_sim, serverless_sims, canary_percent=100)
    model = config.models["m"]
    ded = model.dedicated[0].model_copy(update={"api_key": "upstream-secret"})
    config = config.model_copy(
        update={
            "auth": config.auth.model_copy(update={"admin_key": "admin-secret"}),
            "models": {"m": model.model_copy(update={"dedicated": (ded,)})},
        }
    )
    with ThreadServer(create_app(config)) as server:
        yield server


def route_of(gw: ThreadServer, user: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[], max_tokens=1, user=user)
    return raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"]


def test_get_model_shows_config_and_live_state_without_secrets(admin_gateway):
    response = httpx.get(admin_gateway.url + "/admin/models/m", headers=ADMIN)
    assert response.status_code == 200
    body = response.json()
    assert body["canary_percent"] == 100
    assert body["dedicated"] == [
        {
            "name": "ded",
            "max_concurrency": 4,
            "in_flight": 0,
            "waiting": 0,
            "queue_depth": 0,
            "slo_breached": False,
            "engine_saturated": False,
            "base_url": body["config"]["dedicated"][0]["base_url"],  # one endpoint: where it is
        }
    ]
    assert body["routes"]["sl1"] == {
        "kind": "serverless",
        "circuit": {"state": "closed"},
        "ttft_ms": None,
        "e2e_ms": None,
    }
    assert "upstream-secret" not in response.text


def test_get_model_shows_each_routes_windowed_latency(admin_gateway):
    client = openai.OpenAI(base_url=admin_gateway.url + "/v1", api_key="x", max_retries=0)
    for _ in range(5):
        for _ in client.chat.completions.create(model="m", messages=[], max_tokens=2, stream=True):
            pass

    def ttft() -> dict | None:
        return httpx.get(admin_gateway.url + "/admin/models/m", headers=ADMIN).json()["routes"]["ded"][
            "ttft_ms"
        ]

    wait_until(lambda: (ttft() or {}).get("samples") == 5, timeout=10, interval=0.1)
    figures = ttft()
    assert figures is not None
    assert 0 < figures["p50"] <= figures["p95"] <= figures["p99"]
    assert figures["cv_percent"] >= 0


def test_canary_set_to_zero_sends_everyone_to_serverless_then_back(admin_gateway):
    assert route_of(admin_gateway, "alice") == ("ded", "baseline")
    put = httpx.put(admin_gateway.url + "/admin/models/m/canary", json={"percent": 0}, headers=ADMIN)
    assert put.status_code == 200 and put.json()["canary_percent"] == 0
    assert route_of(admin_gateway, "alice") == ("sl0", "canary_out")
    httpx.put(admin_gateway.url + "/admin/models/m/canary", json={"percent": 100}, headers=ADMIN)
    assert route_of(admin_gateway, "alice") == ("ded", "baseline")


@pytest.mark.parametrize(("headers", "status"), [({}, 401), ({"authorization": "Bearer nope"}, 401)])
def test_admin_needs_the_admin_key(admin_gateway, headers, status):
    response = httpx.put(admin_gateway.url + "/admin/models/m/canary", json={"percent": 5}, headers=headers)
    assert response.status_code == status
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("body", [{"percent": 101}, {"percent": -1}, {"percent": "5"}, {"percent": True}, {}])
def test_bad_canary_values_are_400(admin_gateway, body):
    response = httpx.put(admin_gateway.url + "/admin/models/m/canary", json=body, headers=ADMIN)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "percent"


def test_non_json_admin_body_is_400(admin_gateway):
    response = httpx.put(admin_gateway.url + "/admin/models/m/canary", content=b"{", headers=ADMIN)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_404(admin_gateway):
    response = httpx.get(admin_gateway.url + "/admin/models/nope", headers=ADMIN)
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_admin_is_disabled_without_an_admin_key(gateway):
    response = httpx.get(gateway.url + "/admin/models/m", headers=ADMIN)
    assert response.status_code == 403 and response.json()["error"]["code"] == "admin_disabled"


def test_cli_canary_set(admin_gateway):
    done = run_cli("canary", "set", "m", "25", "--url", admin_gateway.url, "--admin-key", "admin-secret")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "m: canary 25% (configured 100%)"
    assert "`tidegate canary reset m` returns to the file's" in done.stdout  # the live percent wins
    assert httpx.get(admin_gateway.url + "/admin/models/m", headers=ADMIN).json()["canary_percent"] == 25
    wrong = run_cli("canary", "set", "m", "25", "--url", admin_gateway.url, "--admin-key", "bad")
    assert wrong.returncode == 1 and "401" in wrong.stderr


def test_cli_stats_prints_each_route(admin_gateway):
    client = openai.OpenAI(base_url=admin_gateway.url + "/v1", api_key="x", max_retries=0)
    for _ in range(3):
        for _ in client.chat.completions.create(model="m", messages=[], max_tokens=2, stream=True):
            pass
    routes = admin_gateway.url + "/admin/routes?window=1m"
    # a stream is recorded when its response has ended, just after the client read it
    wait_until(lambda: httpx.get(routes, headers=ADMIN).json()["models"]["m"]["requests"] == 3, timeout=5)
    done = run_cli("stats", "--url", admin_gateway.url, "--admin-key", "admin-secret", "--window", "1m")
    assert done.returncode == 0, done.stderr
    assert "3 requests" in done.stdout
    for route in ("ded", "sl0", "sl1"):
        assert route in done.stdout
    assert "first_try 3" in done.stdout


def test_cli_stats_reports_a_refusal_clearly(admin_gateway):
    done = run_cli("stats", "--url", admin_gateway.url, "--admin-key", "wrong")
    assert done.returncode == 1
    assert done.stderr.startswith("401: ")


def test_cli_stats_watch_refreshes_until_interrupted(admin_gateway):
    """On a terminal (a pty here, so rich draws live frames) --watch shows the report, keeps
    redrawing it, and exits 0 on Ctrl-C. Synchronised on what it printed, not on a sleep
    (its start-up alone can take longer than any fixed pause on a loaded machine)."""
    args = [
        sys.executable,
        "-m",
        "tidegate",
        "stats",
        "--url",
        admin_gateway.url,
        "--admin-key",
        "admin-secret",
    ]
    terminal, their_end = pty.openpty()
    watcher = subprocess.Popen([*args, "--watch", "--every", "0.2"], stdout=their_end, stderr=subprocess.PIPE)
    os.close(their_end)
    shown: list[bytes] = []

    def read_terminal() -> None:
        with contextlib.suppress(OSError):  # EIO once the watcher has exited
            while chunk := os.read(terminal, 65536):
                shown.append(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        wait_until(lambda: b"requests" in b"".join(shown), timeout=60)
        drawn = len(b"".join(shown))
        wait_until(lambda: len(b"".join(shown)) > drawn, timeout=30)  # it redraws
        assert watcher.poll() is None, "--watch ended on its own"
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=10)
    finally:
        if watcher.poll() is None:
            watcher.kill()
        reader.join(timeout=5)
        os.close(terminal)
    assert watcher.returncode == 0, err
    assert "requests" in b"".join(shown).decode(errors="replace")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"endpoints": []},
        {"endpoints": {"nope": {"verdict": "parity"}}},
        {"endpoints": {"ded": {"verdict": "fine"}}},
        {"endpoints": {"ded": "parity"}},
    ],
)
def test_bad_parity_verdicts_are_400_and_change_nothing(admin_gateway, body):
    response = httpx.put(admin_gateway.url + "/admin/models/m/parity", json=body, headers=ADMIN)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "endpoints"
    shown = httpx.get(admin_gateway.url + "/admin/models/m", headers=ADMIN).json()
    assert shown["parity"] is None


def test_applied_parity_verdicts_are_shown_not_enforced_by_default(admin_gateway):
    name = next(
        iter(httpx.get(admin_gateway.url + "/admin/models/m", headers=ADMIN).json()["serverless_order"])
    )
    body = {"at": "t", "endpoints": {name: {"verdict": "diverges", "why": "w" * 1000, "failed_cases": ["a"]}}}
    response = httpx.put(admin_gateway.url + "/admin/models/m/parity", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    verdict = response.json()["parity"]["endpoints"][name]
    assert verdict["verdict"] == "diverges" and len(verdict["why"]) == 300  # text cut short
    assert verdict["excluded"] is False and response.json()["parity"]["enforce"] is False
    assert name in httpx.get(admin_gateway.url + "/admin/models/m", headers=ADMIN).json()["serverless_order"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "x", "colour": "red"}, "colour"),
        ({"name": "x", "rpm": 0}, "rpm"),
        ({"name": "admin"}, "name"),
        ({"name": "x", "models": ["nope"]}, "models"),
        ({"name": "x", "priority": "urgent"}, "priority"),
        ({"name": "x", "expires_at": "2027-01-01T00:00:00"}, "expires_at"),
        ({"team": "t"}, "name"),
    ],
)
def test_bad_key_bodies_are_400_naming_the_field(admin_gateway, body, param):
    response = httpx.post(admin_gateway.url + "/admin/keys", json=body, headers=ADMIN)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert httpx.get(admin_gateway.url + "/admin/keys", headers=ADMIN).json()["keys"] == []


def test_a_made_key_names_its_caller_at_once_and_not_after_revoke_on_the_memory_store(admin_gateway):
    made = httpx.post(admin_gateway.url + "/admin/keys", json={"name": "bi", "rpm": 5}, headers=ADMIN).json()
    client = openai.OpenAI(base_url=admin_gateway.url + "/v1", api_key=made["secret"], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-ratelimit-limit-requests"] == "5"
    assert raw.headers["x-ratelimit-remaining-requests"] == "4"
    listed = httpx.get(admin_gateway.url + "/admin/keys", headers=ADMIN).json()["keys"]
    assert [k["name"] for k in listed] == ["bi"] and "secret" not in listed[0]
    assert httpx.delete(admin_gateway.url + "/admin/keys/bi", headers=ADMIN).status_code == 200
    after = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert "x-ratelimit-limit-requests" not in after.headers  # this gateway runs open: now anonymous
    assert httpx.delete(admin_gateway.url + "/admin/keys/bi", headers=ADMIN).status_code == 404
