"""`GET /admin/routes`: what every replica recorded, merged through Redis, agrees with what
the clients measured."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from router.economics.routes_report import cv_verdict, parse_window
from router.state.latency import RELATIVE_ACCURACY
from tests.conftest import dedicated_profile, serverless_profile
from tests.servers import CliProcess, Sim, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS

ADMIN = {"authorization": "Bearer adm"}


@pytest.mark.parametrize(
    ("text", "seconds"), [("300", 300), ("30s", 30), ("5m", 300), ("1h", 3600), ("1.5m", 90)]
)
def test_parse_window(text, seconds):
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "-5m", "m"])
def test_parse_window_refuses_what_is_not_a_duration(text):
    with pytest.raises(ValueError):
        parse_window(text)


@pytest.mark.parametrize(
    ("cv", "verdict"),
    [
        (10, "solid"),
        (39.9, "solid"),
        (40, "variable"),
        (100, "variable"),
        (150, "cold starts"),
        (301, "not production-ready"),
    ],
)
def test_cv_verdicts_follow_the_field_notes(cv, verdict):
    assert cv_verdict(cv) == verdict


def client_ttfts(url: str, count: int, concurrency: int) -> list[float]:
    """Stream `count` requests through `url`; each TTFT (ms) as the client saw it."""
    ttfts: list[float] = []
    lock = threading.Lock()
    todo = iter(range(count))

    def worker() -> None:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
        # the SDK's first request pays its own one-off set-up (connection, platform headers,
        # tens of ms): spend it on a call the routes report does not count, not on a timed one
        client.models.list()
        while (i := next(todo, None)) is not None:
            started = time.perf_counter()
            first = None
            for chunk in client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
                user=f"u{i}",
            ):
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = (time.perf_counter() - started) * 1000
            assert first is not None
            with lock:
                ttfts.append(first)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return ttfts


def rank(values: list[float], q: float) -> float:
    """The sketch's quantile definition: the value at rank floor(q x (n - 1))."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def test_two_replicas_report_the_combined_figures(tmp_path: Path, redis_url):
    # serverless-only model with a real spread of TTFT (kimi-b preset at half its delays)
    with Sim(serverless_profile(ttft=SERVERLESS_PRESETS["kimi-b"], time_scale=2.0, seed=5)) as sl:
        config = tmp_path / "t.yaml"
        config.write_text(
            f"state: {{redis_url: '{redis_url}'}}\nauth: {{admin_key: adm, allow_anonymous: true}}\n"
            f"models:\n  m:\n    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
        )
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as a,
            CliProcess("serve", "--config", str(config), "--port", "0") as b,
        ):
            # two clients per replica: on 2 cores, more client threads inflate the TTFT the
            # clients measure (their own CPU queueing) beyond what the gateway could see
            measured = client_ttfts(a.url, 30, 2) + client_ttfts(b.url, 30, 2)

            def report(gw: CliProcess) -> dict:
                answer = httpx.get(gw.root + "/admin/routes?window=5m", headers=ADMIN)
                assert answer.status_code == 200, answer.text
                return answer.json()["models"]["m"]

            # both replicas flush within a second; either one then sees all 60
            wait_until(
                lambda: report(a)["routes"]["sl"]["ttft_ms"]["samples"] == 60, timeout=10, interval=0.2
            )
            from_a, from_b = report(a), report(b)
        held = sl.stats()["first_token_delays_ms"]  # what the upstream itself waited, per request
    assert from_a["requests"] == from_b["requests"] == 60
    route = from_a["routes"]["sl"]
    assert route == from_b["routes"]["sl"]
    assert route["success_rate"] == 1.0 and route["outcomes"] == {"first_try": 60}
    assert route["reasons"] == {"serverless_only": 60}
    assert len(held) == 60
    for q, name in ((0.5, "p50"), (0.95, "p95")):
        # per request: the upstream's own hold <= the gateway's attempt TTFT (sent -> first
        # event) <= the client's TTFT, so the same quantile of each is in that order too; the
        # sketch adds at most 1% either way. (No bound on the overheads between them: they are
        # wall-clock time on a shared machine.)
        assert (
            rank(held, q) * (1 - 2 * RELATIVE_ACCURACY)
            <= route["ttft_ms"][name]
            <= rank(measured, q) * (1 + 2 * RELATIVE_ACCURACY)
        )
    assert route["ttft_ms"]["verdict"] == "too few samples (< 75)"  # 60 samples: no verdict yet


def test_dedicated_routes_report_utilization_and_queue(tmp_path: Path, redis_url):
    with (
        Sim(dedicated_profile(max_concurrency=2, time_scale=1.0, itl_s=0.01)) as ded,
        Sim(serverless_profile()) as sl,
    ):
        config = tmp_path / "t.yaml"
        config.write_text(
            f"state: {{redis_url: '{redis_url}'}}\nauth: {{admin_key: adm, allow_anonymous: true}}\n"
            "models:\n  m:\n"
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 2}}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n"
        )
        with CliProcess("serve", "--config", str(config), "--port", "0") as gw:
            client_ttfts(gw.url, 12, 4)
            wait_until(
                lambda: (
                    httpx.get(gw.root + "/admin/routes?window=1m", headers=ADMIN).json()["models"]["m"][
                        "requests"
                    ]
                    == 12
                ),
                timeout=10,
                interval=0.2,
            )
            model = httpx.get(gw.root + "/admin/routes?window=1m", headers=ADMIN).json()["models"]["m"]
            bad = httpx.get(gw.root + "/admin/routes?window=forever", headers=ADMIN)
    ded_route, sl_route = model["routes"]["ded"], model["routes"]["sl"]
    assert ded_route["requests"] + sl_route["requests"] == 12
    assert ded_route["requests"] >= 2 and sl_route["requests"] >= 1  # 4 at a time on 2 slots
    assert 0 < ded_route["utilization"] <= 1
    assert ded_route["in_flight"] == 0 and ded_route["queue_depth"] == 0
    assert model["spill_rate"]["saturated"] == pytest.approx(sl_route["requests"] / 12, abs=1e-3)
    assert ded_route["itl_p50_ms"] > 0 and ded_route["tokens_out"] > 0
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "window"
