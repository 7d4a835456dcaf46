"""Predicted-TTFT admission (issue 18): a table of (pending prompt tokens, prefill model,
serverless figures) -> (targets, reason, the token budget the store enforces); the config's
refusals; what the prefill learner fits."""

from __future__ import annotations

import random

import pytest

from policies import registry
from policies.base import Reason, RequestContext
from policies.placement import Placement
from policies.predicted_ttft import Admission
from policies.types import EngineQueue, Figures, PrefillModel, Snapshot
from router.config import (
    ConfigError,
    DedicatedEndpoint,
    ModelConfig,
    PlacementConfig,
    RoutingConfig,
    ServerlessEndpoint,
    SloConfig,
    parse_config,
)
from router.signals.prefill import PrefillLearner

D1 = DedicatedEndpoint(gpu_hour_usd=0, name="d1", base_url="http://d1/v1", model="x", max_concurrency=64)
D2 = DedicatedEndpoint(gpu_hour_usd=0, name="d2", base_url="http://d2/v1", model="x", max_concurrency=64)
S1 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s1", base_url="http://s1/v1", model="x")
MODEL = ModelConfig(
    # replicas in listed order: these tables are about admission (placement: test_placement.py)
    routing=RoutingConfig(admission=Admission.PREDICTED_TTFT, placement=PlacementConfig(mode=Placement.LISTED)),
    slo=SloConfig(ttft_budget_ms=2000),
    dedicated=(D1, D2),
    serverless=(S1,),
)
PREFILL = {"d1": PrefillModel(10_000, 100), "d2": PrefillModel(10_000, 100)}  # 100 ms + 0.1 ms/token
POLICY = registry.build("dedicated_first", MODEL)


def context(prompt_tokens: int) -> RequestContext:
    return RequestContext("m", stream=True, stickiness_key=None, prompt_tokens=prompt_tokens)


def serverless_median(ms: float) -> dict[str, Figures]:
    return {"m/s1": Figures(samples=100, p50=ms, p95=ms * 2, p99=ms * 3, mean=ms * 5, cv=0.2)}


@pytest.mark.parametrize(
    ("pending", "in_flight", "spill_mean_ms", "targets", "reason"),
    [
        # 2,000 tokens ahead: 100 + 400 ms, within the budget on both
        ({"d1": 2_000}, {}, None, (D1, D2, S1), Reason.BASELINE),
        # d1 would take 100 + 2,100 ms: over; d2 is empty
        ({"d1": 19_000}, {}, None, (D2, S1), Reason.BASELINE),
        # both over the budget: spill now, never wait first
        ({"d1": 19_000, "d2": 25_000}, {}, 600.0, (S1,), Reason.PREDICTED_SLOW),
        ({"d1": 19_000, "d2": 25_000}, {}, None, (S1,), Reason.PREDICTED_SLOW),
        # ... whatever the spill route's window says: a cold load's samples fill it for a window
        # after the route is warm again, and an over-budget prompt would delay every later one
        ({"d1": 19_000, "d2": 25_000}, {}, 9_000.0, (S1,), Reason.PREDICTED_SLOW),
        # the slot ceiling still holds whatever the prediction
        ({}, {"d1": 64, "d2": 64}, None, (S1,), Reason.SATURATED),
    ],
)
def test_the_prediction_steers_and_the_ceiling_holds(pending, in_flight, spill_mean_ms, targets, reason):
    snapshot = Snapshot(
        now=0.0,
        in_flight=in_flight,
        pending_prompt_tokens=pending,
        prefill=PREFILL,
        ttft=serverless_median(spill_mean_ms) if spill_mean_ms else {},
    )
    decision = POLICY.decide(context(1_000), snapshot, MODEL.endpoints)
    assert decision.targets == targets
    assert decision.reason is reason
    assert decision.queue_ms == 0  # predicted admission never waits in line


def test_a_fitting_pool_is_admitted_only_within_the_tokens_the_budget_allows():
    snapshot = Snapshot(now=0.0, pending_prompt_tokens={"d1": 5_000}, prefill=PREFILL)
    decision = POLICY.decide(context(1_000), snapshot, MODEL.endpoints)
    assert decision.admit_within == {"d1": 19_000, "d2": 19_000}  # (2,000 - 100) ms x 10 tokens/ms


def test_a_breached_route_keeps_the_filters_reason_over_the_pickers():
    snapshot = Snapshot(now=0.0, prefill=PREFILL, slo_breached=frozenset({"m/d1", "m/d2"}))
    decision = POLICY.decide(context(10), snapshot, MODEL.endpoints)
    assert decision.targets == (S1,) and decision.reason is Reason.SLO_BREACH


CONFIG = """
auth: {allow_anonymous: true}
models:
  m:
    routing: {admission: predicted_ttft%s}
    slo: {%s}
    dedicated: [{name: d, gpu_hour_usd: 0, base_url: "http://127.0.0.1:1/v1", model: x, max_concurrency: 8}]
    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: "http://127.0.0.1:2/v1", model: x}]
"""


@pytest.mark.parametrize(
    ("routing", "slo", "key"),
    [
        ("", "", "models.m.slo.ttft_budget_ms"),
        (", max_queue_ms: 500", "ttft_budget_ms: 2000", "models.m.routing.max_queue_ms"),
    ],
)
def test_an_ambiguous_or_incomplete_predicted_admission_config_is_refused_by_key(routing, slo, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(CONFIG % (routing, slo), {})


def test_the_budget_defaults_to_the_slos_p95_target():
    config = parse_config(CONFIG % ("", "ttft_p95_ms: 1500"), {})
    assert config.models["m"].slo.admission_budget_ms == 1500


def test_the_learner_recovers_rate_and_overhead_and_keeps_the_prior_until_it_has_samples():
    prior = PrefillModel(8_000, 50)
    learner = PrefillLearner({"d": prior}, min_samples=20)
    rng = random.Random(1)
    for _ in range(10):
        learner.sample("d", 4_000, 80 + 4_000 / 16.5)
    learner.fit()
    assert learner.models["d"] == prior  # too few samples
    for _ in range(300):
        tokens = rng.randint(500, 40_000)
        learner.sample("d", tokens, 80 + tokens / 16.5 + rng.gauss(0, 5))  # 16.5k tokens/s, 80 ms
    learner.fit()
    fitted = learner.models["d"]
    assert fitted.tokens_per_s == pytest.approx(16_500, rel=0.03)
    assert fitted.overhead_ms == pytest.approx(80, abs=10)
    assert fitted.samples == 310  # every sample so far: the window holds the last 512


def test_prompts_all_the_same_size_refit_only_the_overhead():
    learner = PrefillLearner({"d": PrefillModel(8_000, 50)}, min_samples=5)
    for _ in range(50):
        learner.sample("d", 2_000, 400.0)
    learner.fit()
    assert learner.models["d"].tokens_per_s == 8_000
    assert learner.models["d"].overhead_ms == pytest.approx(400 - 250)


@pytest.mark.parametrize(
    ("pending", "queue", "targets", "reason", "bound"),
    [
        # the engine holds nothing beyond tidegate's count: the prediction and bound as before
        ({"d1": 2_000}, EngineQueue(1, 1_000), (D1, D2, S1), Reason.BASELINE, 19_000),
        # 15 requests of ~1,000 tokens wait in d1's engine, from clients that bypass tidegate:
        # 100 + 1,600 ms with this request, within; the store may admit 4,000 fewer tokens
        ({}, EngineQueue(15, 1_000), (D1, D2, S1), Reason.BASELINE, 4_000),
        # 25 of them: 100 + 2,600 ms on d1, over the budget, though tidegate has nothing there
        ({}, EngineQueue(25, 1_000), (D2, S1), Reason.BASELINE, None),
        # nothing finished yet: each waiting request is sized as this one
        ({}, EngineQueue(25, None), (D2, S1), Reason.BASELINE, None),
    ],
)
def test_the_engines_own_queue_counts_load_that_bypasses_tidegate(pending, queue, targets, reason, bound):
    snapshot = Snapshot(now=0.0, pending_prompt_tokens=pending, prefill=PREFILL, engine_queue={"d1": queue})
    decision = POLICY.decide(context(1_000), snapshot, MODEL.endpoints)
    assert (decision.targets, decision.reason) == (targets, reason)
    assert decision.admit_within.get("d1") == bound


def test_the_learner_measures_how_far_ttfts_run_over_its_line():
    """A line fitted through jittery TTFTs is their mean: admitting up to it would miss the
    budget about half the time. The model carries the residuals' 95th percentile."""
    exact = PrefillLearner({"d": PrefillModel(8_000, 50)}, min_samples=20)
    jittery = PrefillLearner({"d": PrefillModel(8_000, 50)}, min_samples=20)
    rng = random.Random(3)
    for i in range(400):
        tokens = rng.randint(500, 40_000)
        exact.sample("d", tokens, 80 + tokens / 16.5)
        jittery.sample("d", tokens, 80 + tokens / 16.5 + (300.0 if i % 10 == 0 else 0.0))  # 10% run late
    exact.fit()
    jittery.fit()
    assert exact.models["d"].error_ms == pytest.approx(0.0, abs=1e-6)
    assert 200 < jittery.models["d"].error_ms < 320
    assert PrefillModel(8_000, 50).error_ms == 0  # a prior has no measured error


def test_admission_holds_the_line_plus_the_error_to_the_budget():
    # 16,000 tokens ahead on d1: 100 + 1,700 ms on the line, within 2,000; +300 ms error: over
    late = {name: PrefillModel(10_000, 100, samples=100, error_ms=300) for name in ("d1", "d2")}
    snapshot = Snapshot(now=0.0, pending_prompt_tokens={"d1": 16_000}, prefill=late)
    decision = POLICY.decide(context(1_000), snapshot, (D1, D2, S1))
    assert decision.targets == (D2, S1) and decision.reason is Reason.BASELINE
    # the store's bound leaves the error's worth of tokens free: (2,000 - 300 - 100) ms x 10/ms
    assert decision.admit_within == {"d2": 16_000}
