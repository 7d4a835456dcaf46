"""Acceptance for the economics (issue 14): two gateway processes sharing a real Redis, real
simulators, the official SDK. A known mix of requests (upstream failures that fail over, cut
streams, answers cut by max_tokens, feedback through the *other* replica, requests grouped into
tasks) and the report must agree with what is computed independently: serverless cost from the
simulators' own token counters (exactly), successful tasks per route from what each client saw,
dedicated cost from the provisioned price and the report's own window span (within 1%)."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.servers import CliProcess, Sim, run_cli, wait_until
from tidegate.sim.profile import SERVERLESS_PRESETS, Faults, Kind, SimProfile

ADMIN = "economics-admin"
GPUS, GPU_HOUR_USD = 2, 3.6
PRICES = {"sl1": (0.5, 2.0), "sl2": (0.9, 3.1)}


def write_config(path: Path, ded: Sim, sl1: Sim, sl2: Sim, redis_url: str) -> Path:
    path.write_text(
        # a 1 s Redis timeout on a loaded machine counts a task on its own (the documented
        # degraded mode, tested elsewhere), which would make this exact count wrong
        f"state: {{redis_url: '{redis_url}', redis_timeout_s: 10}}\n"
        f"auth: {{api_keys: [client-key], admin_key: {ADMIN}}}\n"
        "models:\n  m:\n"
        "    routing: {serverless: configured}\n"
        "    retry: {attempts: 3, backoff_ms: 1, budget_percent: 100}\n"
        "    breaker: {consecutive_failures: 1000, min_requests: 1000}\n"
        f"    dedicated: [{{name: ded, base_url: '{ded.base_url}', model: d, max_concurrency: 2,"
        f" gpus: {GPUS}, gpu_hour_usd: {GPU_HOUR_USD}}}]\n"
        "    serverless:\n"
        + "".join(
            f"      - {{name: {name}, base_url: '{sim.base_url}', model: s, usd_per_mtok_in: {p_in},"
            f" usd_per_mtok_out: {p_out}}}\n"
            for (name, (p_in, p_out)), sim in zip(PRICES.items(), (sl1, sl2), strict=True)
        )
    )
    return path


def sims() -> tuple[SimProfile, SimProfile, SimProfile]:
    fast = SERVERLESS_PRESETS["fast"]
    return (
        SimProfile(
            kind=Kind.DEDICATED,
            name="ded",
            max_concurrency=64,
            itl_s=0.003,
            seed=3,
            faults=Faults(error_rate=0.25),
        ),
        SimProfile(
            kind=Kind.SERVERLESS,
            name="sl1",
            ttft=fast,
            serverless_itl_s=0.001,
            seed=4,
            faults=Faults(cut_rate=0.3),
        ),
        SimProfile(kind=Kind.SERVERLESS, name="sl2", ttft=fast, serverless_itl_s=0.001, seed=5),
    )


def send(client: openai.OpenAI, *, stream: bool, max_tokens: int | None, task: str | None) -> dict[str, Any]:
    """One request as the application sees it: route, request id, and whether it succeeded."""
    extra: dict[str, Any] = {"extra_headers": {"x-tidegate-task-id": task}} if task else {}
    if max_tokens is not None:
        extra["max_tokens"] = max_tokens
    messages = [{"role": "user", "content": "tell me something"}]
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=messages, stream=stream, **extra
    )
    seen = {"route": raw.headers["x-tidegate-route"], "request_id": raw.headers["x-tidegate-request-id"]}
    # the answer the caller asked for: it ended, or its own max_tokens cut it (the default of
    # success.length_under_max_tokens)
    wanted = ("stop", "length") if max_tokens is not None else ("stop",)
    if not stream:
        seen["ok"] = raw.parse().choices[0].finish_reason in wanted
        return seen
    finish = None
    try:
        for chunk in raw.parse():
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
    except openai.APIError:  # the gateway's error event after a cut
        finish = None
    seen["ok"] = finish in wanted
    return seen


def report(url: str) -> dict[str, Any]:
    answer = httpx.get(
        url.removesuffix("/v1") + "/admin/report?window=5m", headers={"authorization": f"Bearer {ADMIN}"}
    )
    answer.raise_for_status()
    return answer.json()


@pytest.mark.timeout(180)
def test_the_report_matches_what_the_simulators_and_clients_counted(tmp_path, redis_url):
    rng = random.Random(7)
    profiles = sims()
    with Sim(profiles[0]) as ded, Sim(profiles[1]) as sl1, Sim(profiles[2]) as sl2:
        config = write_config(tmp_path / "economics.yaml", ded, sl1, sl2, redis_url)
        assert run_cli("check-config", str(config)).returncode == 0
        launched = time.time()  # the gateways start after this: dedicated is billed from then
        with (
            CliProcess("serve", "--config", str(config), "--port", "0") as a,
            CliProcess("serve", "--config", str(config), "--port", "0") as b,
        ):
            clients = [
                openai.OpenAI(base_url=g.url, api_key="client-key", max_retries=0, timeout=60) for g in (a, b)
            ]
            sent: list[dict[str, Any]] = []
            # tasks of 1-3 requests, sent in order, each step on the other replica: the two
            # replicas' ledgers settle in their own time, so a task's steps can settle out of
            # order, and the task must still be on its last request's route
            for i in range(60):
                task = f"task-{i}" if i % 3 == 0 else None
                for step in range(3 if task else 1):
                    max_tokens = 4 if rng.random() < 0.15 else None  # cut by the caller: a success
                    seen = send(
                        clients[(i + step) % 2], stream=rng.random() < 0.6, max_tokens=max_tokens, task=task
                    )
                    sent.append(seen | {"task": task or seen["request_id"]})
            failed_by_app = rng.sample([s for s in sent if s["ok"]], 5)
            for n, seen in enumerate(failed_by_app):  # feedback through the replica that did not serve it
                key = (
                    {"task_id": seen["task"]}
                    if seen["task"].startswith("task-")
                    else {"request_id": seen["request_id"]}
                )
                answer = httpx.post(
                    (b if n % 2 else a).url + "/feedback",
                    json=key | {"success": False, "reason": "the app's own validator said no"},
                    headers={"authorization": "Bearer client-key"},
                )
                assert answer.status_code == 200, answer.text
                assert answer.json()["applied"] is True

            # what the clients saw: a task succeeds when its last request did and no feedback failed it
            last: dict[str, dict[str, Any]] = {}
            for seen in sent:
                last[seen["task"]] = seen
            marked = {s["task"] for s in failed_by_app}
            expected_ok: dict[str, int] = defaultdict(int)
            expected_tasks: dict[str, int] = defaultdict(int)
            for task, seen in last.items():
                expected_tasks[seen["route"]] += 1
                expected_ok[seen["route"]] += int(seen["ok"] and task not in marked)

            observed: dict[str, Any] = {}

            def settled() -> bool:
                found = report(a.url)["models"]["m"]
                routes = found["economics"]["routes"]
                observed.update(
                    requests=found["requests"],
                    feedback_failed=sum(r["feedback_failed"] for r in routes.values()),
                    tasks={r: routes[r]["tasks"] for r in routes},
                )
                return (
                    observed["requests"] == len(sent)
                    and observed["feedback_failed"] == len(marked)
                    and all(n == expected_tasks.get(r, 0) for r, n in observed["tasks"].items())
                )

            try:
                wait_until(settled, timeout=60, interval=0.2)
            except AssertionError:  # say what never agreed
                wanted = {"requests": len(sent), "feedback_failed": len(marked), "tasks": dict(expected_tasks)}
                raise AssertionError(f"the report never agreed: {observed} against {wanted}") from None
            found = report(a.url)
            reported = time.time()
        stats = {"sl1": sl1.stats(), "sl2": sl2.stats(), "ded": ded.stats()}

    economics = found["models"]["m"]["economics"]
    assert sum(stats["ded"]["faults"].values()) > 0, "the mix had failed dedicated attempts"
    assert stats["sl1"]["cut_output_events"] > 0, "the mix had cut streams"
    for route in ("ded", "sl1", "sl2"):
        r = economics["routes"][route]
        assert r["successful_tasks"] == expected_ok.get(route, 0), route
        assert r["tasks"] == expected_tasks.get(route, 0), route
    for route, (p_in, p_out) in PRICES.items():
        s = stats[route]
        tokens_cost = (
            s["usage_prompt_tokens"] * p_in + (s["usage_completion_tokens"] + s["cut_output_events"]) * p_out
        ) / 1e6
        r = economics["routes"][route]
        assert r["cost_usd"] == pytest.approx(tokens_cost, rel=1e-6, abs=1e-6), route
        if r["successful_tasks"]:
            assert r["cost_per_successful_task_usd"] == pytest.approx(
                tokens_cost / r["successful_tasks"], rel=1e-4
            )
    ded = economics["routes"]["ded"]
    span_s = ded["replica_hours"] * 3600
    rounding_s = 0.5e-4 * 3600  # the report gives replica hours to 4 decimals: ±0.18 s
    # billed since the first gateway started (the store keeps it), not the whole 5-minute window
    assert span_s <= reported - launched + rounding_s
    assert span_s >= reported - launched - 30  # the gateways' start-up, on a loaded machine
    per_s = GPUS * GPU_HOUR_USD / 3600  # replica_hours' rounding is the tolerance: the span is short
    assert ded["cost_usd"] == pytest.approx(per_s * span_s, abs=per_s * rounding_s * 1.01)
    assert ded["wasted_busy_s"] > 0  # the failed attempts held a slot
    blended = economics["blended"]
    assert blended["successful_tasks"] == sum(expected_ok.values())
    assert blended["cost_per_successful_task_usd"] == pytest.approx(
        blended["cost_usd"] / blended["successful_tasks"], rel=1e-4
    )
    assert economics["recommendation"], "the report always says something"
    # the break-even schedule is there exactly when a replica can pay for itself
    break_even = economics["what_if"]["break_even_utilization"]
    assert break_even is not None
    if break_even < 1:
        assert len(economics["schedule"]["week"]) == 168
        assert any("by the break-even rule" in line for line in economics["recommendation"])
    else:
        assert "schedule" not in economics
