"""The sampled planner (tidegate/offline/planner/sampled.py): what a sample stands for, that a
sample of the whole trace is the exact model, and that on steady traffic a sample of a few
slices says what every request says."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from tidegate.offline.calibration import DEDICATED, SERVERLESS, TtftDistribution
from tidegate.offline.planner.plans import Plan, System
from tidegate.offline.planner.sampled import evaluate_sampled, sample
from tidegate.offline.planner.sweep import evaluate
from tidegate.offline.replay import Arrival

D = DEDICATED["deepseek-r1-h200"]
S = dataclasses.replace(SERVERLESS["deepseek-serverless"], ttft=TtftDistribution(0.5, 0.2), idle_to_cold_s=0.0)
SYSTEM = System(D, S)


def _poisson(rate_per_s, span_s, seed, start_s=0.0):
    rng, at, rows = random.Random(seed), start_s, []
    while True:
        at += rng.expovariate(rate_per_s)
        if at >= start_s + span_s:
            return rows
        rows.append(Arrival(at, rng.randint(200, 3000), rng.randint(20, 400)))


def _shaped_trace():
    """Two hours: a quiet hour, an idle quarter, then three quarters at ten times the rate."""
    return _poisson(0.5, 3600, 1) + _poisson(5.0, 2700, 2, start_s=4500)


def test_a_sample_stands_for_every_request_of_the_trace_and_skips_idle_slices():
    rows = _shaped_trace()
    part = sample(rows, rows[-1].at_s, slice_s=300, per_stratum=2)
    counted = sum(s.weight * (len(s.arrivals) - s.counted_from) for s in part.slices)
    assert counted == pytest.approx(len(rows))
    assert part.slices_in_trace == 21  # 12 quiet slices + 9 busy; the idle quarter's 3 have none
    assert len(part.slices) <= 2 * part.strata < part.slices_in_trace
    for piece in part.slices:  # its own arrivals lie in its slice; the warm-up's just before it
        own = piece.arrivals[piece.counted_from :]
        assert all(piece.start_s <= a.at_s + piece.offset_s < piece.start_s + 300 for a in own)
        ahead = piece.arrivals[: piece.counted_from]
        assert all(piece.start_s - 120 <= a.at_s + piece.offset_s < piece.start_s for a in ahead)


def test_a_sample_of_the_whole_trace_is_the_exact_model():
    rows = _shaped_trace()
    span = rows[-1].at_s
    whole = sample(rows, span, slice_s=span + 1)
    for plan in (Plan(0), Plan(1, 16, 250.0), Plan(1, 64, 0.0, 75.0, 2000.0, 30.0)):
        exact = evaluate(rows, plan, SYSTEM, slo_ttft_ms=2000, span_s=span)
        estimated = evaluate_sampled(whole, plan, SYSTEM, slo_ttft_ms=2000)
        for key in ("requests", "succeeded", "slo_attainment", "spill_share", "routes", "dedicated_usd"):
            assert estimated[key] == exact[key], key
        for key in ("serverless_usd", "cost_usd", "cost_per_slo_success_usd"):
            assert estimated[key] == pytest.approx(exact[key], rel=1e-6), key
        assert estimated["ttft_ms"]["p95"] == pytest.approx(exact["ttft_ms"]["p95"], rel=0.01)
        assert estimated["sampled"]["slices"] == 1 and "sampled" not in exact


@pytest.mark.parametrize("plan", [Plan(1, 16, 250.0), Plan(1, 32, 0.0), Plan(2, 8, 1000.0, 75.0)])
def test_on_steady_traffic_a_few_slices_say_what_every_request_says(plan):
    rows = _poisson(4.0, 3 * 3600, 7)  # three steady hours: 36 slices of 5 minutes
    span = rows[-1].at_s
    part = sample(rows, span)
    assert part.modelled < len(rows) / 2
    exact = evaluate(rows, plan, SYSTEM, slo_ttft_ms=600, span_s=span)  # a tight SLO: misses to count
    estimated = evaluate_sampled(part, plan, SYSTEM, slo_ttft_ms=600)
    assert 0.3 < exact["slo_attainment"] < 1.0
    assert abs(estimated["slo_attainment"] - exact["slo_attainment"]) <= 0.02
    assert abs(estimated["spill_share"] - exact["spill_share"]) <= 0.02
    per_success = estimated["cost_per_slo_success_usd"] / exact["cost_per_slo_success_usd"]
    assert math.isclose(per_success, 1.0, abs_tol=0.03)
    assert estimated["dedicated_usd"] == exact["dedicated_usd"]


def test_bad_sampling_settings_are_refused():
    rows = _poisson(1.0, 600, 3)
    for bad in ({"slice_s": 0}, {"per_stratum": 0}, {"ratio": 1.0}, {"warmup_s": -1}):
        with pytest.raises(ValueError, match="sampling needs"):
            sample(rows, 600, **bad)
    with pytest.raises(ValueError, match="in time order"):
        sample(list(reversed(rows)), 600)
