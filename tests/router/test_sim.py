"""The simulator's capacity models and presets, without servers where possible."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from tidegate.sim.engine import Engine
from tidegate.sim.profile import SERVERLESS_PRESETS, Kind, SimProfile

SEED_TABLE = {  # the field notes' table (docs/simulator.md): p50 / p95 TTFT in seconds
    "deepseek-a": (0.39, 0.57),
    "deepseek-b": (0.55, 6.30),
    "deepseek-c": (0.73, 6.91),
    "kimi-a": (0.35, 5.98),
    "kimi-b": (0.25, 1.08),
    "kimi-c": (0.43, 1.70),
}


@pytest.mark.parametrize("preset", sorted(SEED_TABLE))
def test_serverless_presets_reproduce_the_seed_percentiles(preset):
    rng = random.Random(7)
    samples = sorted(SERVERLESS_PRESETS[preset].sample(rng) for _ in range(20_000))
    p50, p95 = samples[10_000], samples[19_000]
    want50, want95 = SEED_TABLE[preset]
    assert p50 == pytest.approx(want50, rel=0.10)
    assert p95 == pytest.approx(want95, rel=0.12)


def test_dedicated_engine_serves_at_most_max_concurrency_and_queues_fifo():
    profile = SimProfile(kind=Kind.DEDICATED, max_concurrency=3, time_scale=1000.0)
    engine = Engine(lambda: profile)
    order: list[int] = []

    async def request(i: int) -> None:
        async with engine.sequence(100) as seq:
            order.append(i)
            await seq.first_token()
            for _ in range(5):
                await seq.next_token()

    async def run() -> None:
        # tasks start in the order they were made, all in one turn of the loop: ten arrivals
        # in order before any step of the engine ends
        await asyncio.gather(*(asyncio.create_task(request(i)) for i in range(10)))

    asyncio.run(run())
    c = engine.counters
    assert c.max_running == 3
    assert c.max_in_flight == 10
    assert order == list(range(10))
    assert (c.completed, c.running, c.queued) == (10, 0, 0)


def test_a_dedicated_prompt_waits_for_the_step_in_progress_then_shares_the_next():
    """The simulator runs the shared-step engine: a prompt arriving while another is being
    prefilled joins the next step, so its first token comes after both prefills (the model's
    own timing is checked in model time in tests/router/test_engine.py)."""
    profile = SimProfile(kind=Kind.DEDICATED, prefill_tokens_per_s=1000.0, time_scale=20.0)
    engine = Engine(lambda: profile)
    order: list[int] = []

    async def request(i: int) -> None:
        async with engine.sequence(500) as seq:
            await seq.first_token()
            order.append(i)

    async def run() -> None:
        await asyncio.gather(request(0), request(1))

    asyncio.run(run())
    first, second = engine.counters.first_token_delays_s
    assert order == [0, 1]
    assert second > 1.5 * first  # its own prefill came after the first's whole step


def test_cancelled_waiter_gives_up_its_place():
    profile = SimProfile(kind=Kind.DEDICATED, max_concurrency=1, time_scale=1.0)
    engine = Engine(lambda: profile)

    async def run() -> None:
        hold = asyncio.Event()

        async def holder() -> None:
            async with engine.sequence(1):
                await hold.wait()

        async def waiter() -> None:
            async with engine.sequence(1) as seq:
                await seq.first_token()  # never: the one slot is held

        h = asyncio.create_task(holder())
        await asyncio.sleep(0)
        w = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        assert engine.counters.queued == 1
        w.cancel()
        await asyncio.gather(w, return_exceptions=True)
        assert engine.counters.queued == 0
        hold.set()
        await h

    asyncio.run(run())
    assert (engine.counters.running, engine.counters.in_flight) == (0, 0)


def test_cold_start_after_idle_gap_adds_a_load_delay():
    fast = dataclasses.replace(SERVERLESS_PRESETS["fast"], cold_range_s=(20.0, 20.0))
    profile = SimProfile(kind=Kind.SERVERLESS, ttft=fast, idle_to_cold_s=60.0)
    now = [0.0]
    engine = Engine(lambda: profile, clock=lambda: now[0])
    now[0] = 1.0
    warm = engine.serverless_ttft_s()
    now[0] = 100.0  # idle for 99 s
    cold = engine.serverless_ttft_s()
    now[0] = 101.0  # a second into the load: waits for the rest of it, no second load
    during = engine.serverless_ttft_s()
    now[0] = 100.0 + cold + 1.0  # after it
    warm_again = engine.serverless_ttft_s()
    assert engine.counters.cold_starts == 1
    assert max(warm, warm_again) < 1.0
    assert cold >= 20.0  # the model load
    assert during == pytest.approx(cold - 1.0, abs=1.0)  # the fast preset's warm TTFT is ~0.02 s
