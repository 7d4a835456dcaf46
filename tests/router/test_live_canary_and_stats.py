"""A live canary percent (a `canary set`, or a run's) outlives restarts and wins over the
file's `canary_percent`: it is shown wherever the percent is (the model view, the routes report
and `stats`, `canary status`) and `canary reset` (DELETE) returns to the file's. And `stats`
stays readable in a 100-column terminal."""

from __future__ import annotations

import time

import pytest
from rich.console import Console

from router.cli.canary import render_plan, render_status
from router.cli.stats import render
from tests.router.asgi import MockUpstreams, answers, asgi_gateway, chat_reply, model_yaml, stream_reply

ADMIN = {"authorization": "Bearer adm"}


def config(dedicated: str = "ded", serverless: tuple[str, ...] = ("sl1",)) -> str:
    text = model_yaml(dedicated=(dedicated,), serverless=serverless, canary=10, capacity=8)
    text = text.replace("auth: {api_keys: [key]}", "auth: {api_keys: [key], admin_key: adm}")
    return text.replace("    canary_percent: 10", "    canary_percent: 10\n    canary: {steps: [50, 100]}")


def text_of(renderable, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


async def test_a_live_canary_is_shown_everywhere_and_reset_returns_to_the_file():
    upstreams = MockUpstreams({"ded": answers(chat_reply()), "sl1": answers(chat_reply())})
    async with asgi_gateway(config(), upstreams) as gw:
        set_live = await gw.client.put("/admin/models/m/canary", json={"percent": 40}, headers=ADMIN)
        routes = (await gw.client.get("/admin/routes?window=1m", headers=ADMIN)).json()
        status = (await gw.client.get("/admin/models/m/canary", headers=ADMIN)).json()
        reset = await gw.client.delete("/admin/models/m/canary", headers=ADMIN)
        routes_after = (await gw.client.get("/admin/routes?window=1m", headers=ADMIN)).json()
        status_after = (await gw.client.get("/admin/models/m/canary", headers=ADMIN)).json()
    assert set_live.status_code == 200
    assert (set_live.json()["canary_percent"], set_live.json()["canary_percent_source"]) == (40, "live")
    assert routes["models"]["m"]["canary"] == {"percent": 40, "configured": 10, "source": "live"}
    assert (status["live_percent"], status["configured_percent"], status["live_override"]) == (40, 10, True)
    shown = text_of(render_status(status), 200)
    assert "live canary 40% overrides the file's canary_percent 10%" in shown
    assert "tidegate canary reset m" in shown
    assert "(live; the file says 10%" in text_of(render(routes, 200), 200)
    assert reset.status_code == 200
    assert (reset.json()["canary_percent"], reset.json()["canary_percent_source"]) == (10, "file")
    assert routes_after["models"]["m"]["canary"]["source"] == "file"
    assert status_after["live_override"] is False
    assert "overrides" not in text_of(render_status(status_after), 200)


async def test_resetting_an_unknown_model_is_a_404():
    upstreams = MockUpstreams({"ded": answers(chat_reply()), "sl1": answers(chat_reply())})
    async with asgi_gateway(config(), upstreams) as gw:
        answer = await gw.client.delete("/admin/models/nope/canary", headers=ADMIN)
    assert answer.status_code == 404
    assert answer.json()["error"]["message"]


async def test_stats_fit_a_100_column_terminal_and_cut_no_figure():
    names = ("vllm-h100-pool-a", "together-deepseek", "fireworks-deepseek")
    upstreams = MockUpstreams({name: answers(stream_reply("a", "b", "c")) for name in names})
    async with asgi_gateway(config(names[0], names[1:]), upstreams) as gw:
        for user in range(20):
            await gw.chat(stream=True, user=f"u{user}")
        await gw.app.state.ledger.drained()
        report = (await gw.client.get("/admin/routes?window=1m", headers=ADMIN)).json()
    narrow = text_of(render(report, 100), 100)
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "…" not in narrow  # rich's mark of a cut cell
    for name in names:
        assert any(name in line for line in lines), name  # each route's name whole, on one line
    assert "- " not in next(line for line in lines if names[0] in line)  # the figures are there
    for header in ("p50", "p95", "p99", "busy", "wait", "util%", "TTFT in ms"):
        assert header in narrow
    wide = text_of(render(report, 220), 220)
    assert "tokens in/out" in wide and "waiting" in wide


async def test_canary_plan_without_a_run_says_it_is_hypothetical():
    upstreams = MockUpstreams({"ded": answers(chat_reply()), "sl1": answers(chat_reply())})
    async with asgi_gateway(config(), upstreams) as gw:
        idle = (await gw.client.get("/admin/models/m/canary/plan", headers=ADMIN)).json()
        await gw.client.post("/admin/models/m/canary/start", headers=ADMIN)
        running = (await gw.client.get("/admin/models/m/canary/plan", headers=ADMIN)).json()
    assert idle["hypothetical"] is True
    assert "no run in progress). A run started now would begin at 50%" in render_plan(idle)
    assert running["hypothetical"] is False
    assert "the controller would" in render_plan(running) and "no run" not in render_plan(running)


async def test_a_report_bills_dedicated_only_since_the_gateway_started():
    """A day's window, a gateway a moment old: the dedicated pool is billed for the moment, not
    for the hours before the gateway (and its GPUs, in the demo) existed."""
    text = config().replace("gpu_hour_usd: 0", "gpu_hour_usd: 3600")  # $1 a second per GPU
    upstreams = MockUpstreams({"ded": answers(chat_reply()), "sl1": answers(chat_reply())})
    async with asgi_gateway(text, upstreams) as gw:
        age_s = time.time() - gw.app.state.store.started_at
        report = (await gw.client.get("/admin/report?window=24h", headers=ADMIN)).json()
        age_after_s = time.time() - gw.app.state.store.started_at
    ded = report["models"]["m"]["economics"]["routes"]["ded"]
    assert age_s * 0.99 <= ded["cost_usd"] <= age_after_s + 1  # ~ its age in seconds at $1/s
    assert ded["replica_hours"] * 3600 <= age_after_s + 1


@pytest.mark.parametrize(("steps", "rate"), [((25, 50, 100), "about 2.0"), ((90, 100), "about 5.0")])
def test_the_demo_banner_says_what_traffic_a_canary_run_needs(steps, rate):
    from router.config import CanaryControllerConfig  # noqa: PLC0415
    from tidegate.cli.demo import canary_volume  # noqa: PLC0415

    said = canary_volume(CanaryControllerConfig(steps=steps, interval_s=20, min_samples=10))
    assert rate in said and "10 requests per side per 20 s" in said  # the smaller side decides
    assert "share of `user` values" in said
    assert "about" not in canary_volume(CanaryControllerConfig(steps=(100,), interval_s=20, min_samples=10))
