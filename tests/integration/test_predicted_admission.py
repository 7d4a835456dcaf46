"""Predicted-TTFT admission through a real gateway and simulators (issue 18): a burst of long
prompts is admitted to dedicated only as far as its prefill fits the TTFT budget, the rest
spill at once (`predicted_slow`), and every pending prompt token is given back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from policies.base import Reason, RequestContext
from policies.predicted_ttft import PredictedTtftFirst
from router.app import create_app
from router.config import parse_config
from router.signals.loop import Signals
from router.state.memory.store import MemoryStore
from tests.conftest import serverless_profile
from tests.servers import Sim, ThreadServer, wait_until
from tidegate.sim.profile import Kind, SimProfile

PROMPT = "x" * 4000  # ~1,000 tokens by the gateway's estimate and the simulator's count


def test_a_burst_of_long_prompts_fills_the_prefill_budget_and_spills_the_rest_at_once():
    dedicated = SimProfile(
        kind=Kind.DEDICATED, name="ded", max_concurrency=64, prefill_tokens_per_s=2000, itl_s=0.001, seed=1
    )
    with Sim(dedicated) as ded, Sim(serverless_profile()) as sl:
        config = parse_config(
            "auth: {allow_anonymous: true, admin_key: " + "a" * 32 + "}\nmodels:\n  m:\n"
            "    routing: {admission: predicted_ttft}\n"
            "    slo: {ttft_budget_ms: 1000}\n"
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 64,"
            " prefill_tokens_per_s: 2000, ttft_overhead_ms: 50}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n",
            {},
        )
        with ThreadServer(create_app(config)) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30)

            def one(_: int) -> tuple[str, str]:
                raw = client.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=2, stream=True
                )
                assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
                return raw.headers["x-tidegate-route"], raw.headers["x-tidegate-reason"]

            with ThreadPoolExecutor(8) as pool:
                seen = Counter(pool.map(one, range(8)))
            # each prompt is ~0.5 s of prefill: a second one alongside would be predicted at
            # ~1.1 s, over the 1 s budget, and unmeasured serverless is assumed to meet it
            assert 1 <= seen[("ded", "baseline")] <= 2, seen
            assert seen[("sl", "predicted_slow")] >= 6, seen
            assert sum(seen.values()) == 8
            admin = {"authorization": "Bearer " + "a" * 32}

            def settled() -> bool:
                route = httpx.get(server.url + "/admin/routes", headers=admin).json()["models"]["m"]["routes"]
                return route["ded"]["pending_prompt_tokens"] == 0 and route["ded"]["in_flight"] == 0

            wait_until(settled, timeout=10)
            routes = httpx.get(server.url + "/admin/routes", headers=admin).json()["models"]["m"]["routes"]
            assert routes["ded"]["prefill_model"]["tokens_per_s"] > 0
            assert ded.stats()["in_flight"] == 0


async def test_the_engines_own_queue_of_requests_that_bypass_tidegate_counts_in_the_prediction():
    """Clients that call the engine directly fill its queue; tidegate has nothing pending there,
    yet the TTFT it predicts counts their prompts (vLLM's waiting gauge, sized by its finished
    requests' mean prompt), so a request it would otherwise admit spills."""
    dedicated = SimProfile(
        kind=Kind.DEDICATED, name="ded", max_concurrency=1, prefill_tokens_per_s=2000, itl_s=0.01, seed=1
    )
    with Sim(dedicated) as ded, Sim(serverless_profile()) as sl:
        metrics_url = ded.base_url.removesuffix("/v1") + "/metrics"
        config = parse_config(
            "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
            "    routing: {admission: predicted_ttft}\n"
            "    slo: {ttft_budget_ms: 1000}\n"
            f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 64,"
            " prefill_tokens_per_s: 2000, ttft_overhead_ms: 50,"
            f" engine_signal: {{metrics_url: '{metrics_url}', max_running: 64}}}}]\n"
            f"    serverless: [{{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: '{sl.base_url}', model: s}}]\n",
            {},
        )
        signals = Signals(config, MemoryStore())
        picker = PredictedTtftFirst(budget_ms=1000)
        request = RequestContext("m", stream=True, stickiness_key=None, prompt_tokens=1000)
        endpoints = config.models["m"].endpoints
        async with httpx.AsyncClient(timeout=30) as client:
            await signals.scrape(client, "ded")
            signals.tick(time.monotonic())  # the signal loop's step publishes the queue
            idle = signals.snapshot()
            assert idle.engine_queue["ded"].waiting == 0
            assert picker.decide(request, idle, endpoints).reason is Reason.BASELINE  # 50 + 500 ms

            async def bypass(max_tokens: int) -> int:  # straight to the engine: ~250 prompt tokens
                body = {
                    "model": "d",
                    "messages": [{"role": "user", "content": "y" * 1000}],
                    "max_tokens": max_tokens,
                }
                answer = await client.post(ded.base_url + "/chat/completions", json=body)
                answer.raise_for_status()
                return int(answer.json()["usage"]["prompt_tokens"])

            async def in_flight(count: int) -> None:
                deadline = asyncio.get_running_loop().time() + 10
                while ded.stats()["in_flight"] < count:
                    assert asyncio.get_running_loop().time() < deadline, ded.stats()
                    await asyncio.sleep(0.01)

            # one long answer holds the engine's only slot (3 s); the rest queue behind it, so
            # they are all waiting however slowly this loaded machine sends them
            flood = [asyncio.create_task(bypass(300))]
            await in_flight(1)
            flood += [asyncio.create_task(bypass(20)) for _ in range(11)]
            await in_flight(12)
            await signals.scrape(client, "ded")
            signals.tick(time.monotonic())  # the signal loop's step publishes the queue
            busy = signals.snapshot()
            assert busy.pending_prompt_tokens.get("ded", 0) == 0  # nothing of tidegate's there
            assert busy.engine_queue["ded"].waiting >= 10
            # 10+ waiting, each sized as this request (nothing finished yet): over 5,000 ms
            decision = picker.decide(request, busy, endpoints)
            assert decision.reason is Reason.PREDICTED_SLOW
            assert [t.name for t in decision.targets] == ["sl"]
            prompts = await asyncio.gather(*flood)
            await signals.scrape(client, "ded")
            signals.tick(time.monotonic())  # the signal loop's step publishes the queue
            # the engine's histogram of finished requests sizes its queue from now on
            assert signals.snapshot().engine_queue["ded"].mean_prompt_tokens == sum(prompts) / len(prompts)
