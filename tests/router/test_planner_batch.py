"""The planner's batch share (issue 30): batch requests wait for a dedicated slot (never
spill), never take the reserve, are out of the TTFT SLO, and are priced as what they are:
more dedicated utilization and less serverless spend than the same traffic all interactive."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tidegate.offline.calibration import DEDICATED, SERVERLESS
from tidegate.offline.planner.model import simulate
from tidegate.offline.planner.plans import SERVERLESS_ROUTE, Plan, System
from tidegate.offline.planner.sweep import evaluate
from tidegate.offline.replay import Arrival, summary

D = DEDICATED["llama-8b-h100"]
S = SERVERLESS["llama-8b-together"]


def arrivals(count: int = 600, rate: float = 6.0, seed: int = 3) -> list[Arrival]:
    rng = random.Random(seed)
    at, rows = 0.0, []
    for _ in range(count):
        at += rng.expovariate(rate)
        rows.append(Arrival(at, rng.randint(200, 2000), rng.randint(50, 400)))
    return rows


def test_batch_requests_never_spill_and_never_take_the_reserved_slots():
    system = System(D, S, batch_share=0.5, batch_reserve=3, batch_max_wait_s=600)
    plan = Plan(1, 8)
    records = simulate(arrivals(), plan, system)
    batch = [r for r in records if r["batch"]]
    assert 250 < len(batch) < 350
    assert all(r["route"] != SERVERLESS_ROUTE for r in batch)
    assert {r["reason"] for r in batch} <= {"batch", "batch_timeout"}
    # at any moment at most 8 - 3 batch requests hold a slot
    events = sorted(  # a slot given back and taken at one instant: the release first
        [(round(r["admitted_s"], 6), 1) for r in batch if r["ok"]]
        + [(round(r["at_s"] + r["e2e_ms"] / 1000, 6), -1) for r in batch if r["ok"]]
    )
    held = peak = 0
    for _, step in events:
        held += step
        peak = max(peak, held)
    assert 3 <= peak <= 5


def test_a_batch_request_past_its_wait_is_refused_and_out_of_the_ttft_figures():
    system = System(D, S, batch_share=1.0, batch_reserve=0, batch_max_wait_s=0.5)
    rows = [Arrival(0.0, 1000, 2000), Arrival(0.01, 1000, 10)]
    first, second = simulate(rows, Plan(1, 1), system)
    assert first["reason"] == "batch" and first["ok"]
    assert second["reason"] == "batch_timeout" and not second["ok"] and second["route"] is None
    found = summary([first, second], 2000, lag_p99_ms=float("inf"))
    assert found["batch"] == {"requests": 2, "answered": 1, "on_dedicated": 1}
    assert found["requests"] == 0 and found["slo_attainment"] is None


@pytest.mark.parametrize("share", [0.3, 0.6])
def test_priced_as_batch_the_same_traffic_uses_dedicated_more_and_serverless_less(share):
    rows = arrivals()
    plan = Plan(1, 16)
    span = rows[-1].at_s
    interactive = System(D, S)
    rng = random.Random(1)
    kept = [a for a in rows if rng.random() >= share]  # the interactive stream alone
    batched = dataclasses.replace(interactive, batch_share=share, batch_reserve=4, batch_max_wait_s=600)
    alone = evaluate(kept, plan, interactive, slo_ttft_ms=2000, span_s=span)
    everyone = evaluate(rows, plan, interactive, slo_ttft_ms=2000, span_s=span)
    mixed = evaluate(rows, plan, batched, slo_ttft_ms=2000, span_s=span)
    assert mixed["dedicated_utilization"] > alone["dedicated_utilization"]
    assert mixed["serverless_usd"] < everyone["serverless_usd"]
    assert mixed["batch"]["answered"] == mixed["batch"]["on_dedicated"] > 0
