"""The stateful-looking steps, tested as pure tables: SLO latch, engine estimate and latch,
`fastest` serverless order, and the wait in line for a dedicated slot."""

from __future__ import annotations

import pytest

from policies import registry
from policies.base import Reason, RequestContext
from policies.engine import EngineLatches, EngineSample, engine_step
from policies.hysteresis import Latch, Thresholds
from policies.slo import slo_step
from policies.types import Figures, Snapshot
from router.config import (
    DedicatedEndpoint,
    EngineSignalConfig,
    ModelConfig,
    RoutingConfig,
    ServerlessEndpoint,
    SloConfig,
)
from router.signals.loop import EngineScrapeError, parse_engine_metrics

D1 = DedicatedEndpoint(gpu_hour_usd=0, name="d1", base_url="http://d1/v1", model="x", max_concurrency=4)
S1 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s1", base_url="http://s1/v1", model="x")
S2 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s2", base_url="http://s2/v1", model="x")
S3 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s3", base_url="http://s3/v1", model="x")


def figures(p95: float, samples: int = 100, cv: float = 0.2, mean: float | None = None) -> Figures:
    return Figures(samples, p95 / 2, p95, p95 * 1.2, mean if mean is not None else p95 / 2, cv)


# --- hysteresis --------------------------------------------------------------------------

T = Thresholds(on_at=10, off_at=5, dwell_s=2)


@pytest.mark.parametrize(
    ("latch", "value", "now", "on"),
    [
        (Latch(), 9.9, 100, False),  # under on_at: stays off
        (Latch(), 10, 100, True),  # at on_at: on
        (Latch(True, 90), 7, 100, True),  # between thresholds: keeps its state
        (Latch(False, 90), 7, 100, False),
        (Latch(True, 90), 5, 100, False),  # at off_at: off
        (Latch(True, 99), 1, 100, True),  # within the dwell: no change
        (Latch(False, 99), 50, 100, False),
        (Latch(True, 90), None, 100, False),  # no evidence counts as off
        (Latch(False, 90), None, 100, False),
    ],
)
def test_thresholds_switch_with_hysteresis_and_dwell(latch, value, now, on):
    assert T.step(latch, value, now).on is on


def test_a_switch_records_when_it_happened():
    assert T.step(Latch(), 11, 42.0) == Latch(True, 42.0)
    assert T.step(Latch(True, 1.0), 6, 42.0) == Latch(True, 1.0)


# --- SLO guard ----------------------------------------------------------------------------

SLO = SloConfig(ttft_p95_ms=1000, recover_ratio=0.8, min_samples=20, dwell_s=0)


@pytest.mark.parametrize(
    ("on_before", "fig", "on_after"),
    [
        (False, figures(1200), True),
        (False, figures(1200, samples=19), False),  # too few samples to judge
        (True, figures(900), True),  # under the SLO but not yet recovered
        (True, figures(800), False),
        (True, figures(5000, samples=3), False),  # samples aged out: try the route again
        (True, None, False),
    ],
)
def test_slo_latch(on_before, fig, on_after):
    assert slo_step(Latch(on_before, 0.0), fig, SLO, 10.0).on is on_after


def test_no_slo_means_no_breach():
    assert not slo_step(Latch(True, 0.0), figures(10**6), SloConfig(), 10.0).on


def context(key: str | None = "k") -> RequestContext:
    return RequestContext("m", stream=True, stickiness_key=key)


def test_breached_dedicated_route_is_skipped_with_reason_slo_breach():
    policy = registry.build("dedicated_first", ModelConfig(serverless=(S1,)))
    snapshot = Snapshot(0.0, slo_breached=frozenset({"m/d1"}))
    decision = policy.decide(context(), snapshot, (D1, S1))
    assert (decision.targets, decision.reason) == ((S1,), Reason.SLO_BREACH)
    other_model = Snapshot(0.0, slo_breached=frozenset({"other/d1"}))
    assert policy.decide(context(), other_model, (D1, S1)).reason is Reason.BASELINE


# --- engine signal ------------------------------------------------------------------------

SIGNAL = EngineSignalConfig(
    metrics_url="http://d1/metrics", stale_after_s=5, waiting_on=2, waiting_off=0, dwell_s=0
)


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        (EngineSample(0, 2, 0.1, 0, max_running=4, dispatched_since=1), 0),  # fills a free slot
        (EngineSample(0, 2, 0.1, 0, max_running=4, dispatched_since=3), 1),  # 2 free, 1 queues
        (EngineSample(3, 4, 0.5, 0, max_running=4, dispatched_since=2, completed_since=1), 4),
        (EngineSample(3, 4, 0.5, 0, max_running=4, completed_since=5), 0),
    ],
)
def test_engine_queue_estimate_counts_traffic_since_the_scrape(sample, expected):
    assert sample.estimated_waiting() == expected


@pytest.mark.parametrize(
    ("sample", "latches", "on_stale", "spill"),
    [
        (EngineSample(2, 4, 0.5, 100.0, 4), EngineLatches(), "trust_leases", True),
        (EngineSample(1, 4, 0.5, 100.0, 4), EngineLatches(), "trust_leases", False),
        (EngineSample(0, 1, 0.97, 100.0, 4), EngineLatches(), "trust_leases", True),  # KV cache full
        (
            EngineSample(1, 4, 0.9, 100.0, 4),
            EngineLatches(Latch(True, 0), Latch(True, 0)),
            "trust_leases",
            True,
        ),
        (EngineSample(0, 2, 0.5, 100.0, 4), EngineLatches(Latch(True, 0)), "trust_leases", False),
        (EngineSample(9, 4, 0.99, 90.0, 4), EngineLatches(), "trust_leases", False),  # stale: leases decide
        (EngineSample(0, 0, 0.0, 90.0, 4), EngineLatches(), "spill", True),  # stale: fail open to serverless
        (None, EngineLatches(), "spill", True),
        (None, EngineLatches(), "trust_leases", False),
    ],
)
def test_engine_step(sample, latches, on_stale, spill):
    signal = SIGNAL.model_copy(update={"on_stale": on_stale})
    assert engine_step(latches, sample, signal, now=100.5)[1] is spill


def test_saturated_engine_spills_with_reason_saturated():
    policy = registry.build("dedicated_first", ModelConfig(serverless=(S1,)))
    decision = policy.decide(context(), Snapshot(0.0, engine_saturated=frozenset({"d1"})), (D1, S1))
    assert (decision.targets, decision.reason) == ((S1,), Reason.SATURATED)


VLLM_TEXT = """\
# HELP vllm:num_requests_waiting Requests waiting
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="x"} 3.0
vllm:num_requests_waiting{engine="1",model_name="x"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="x"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="x"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="x"} 0.9
"""


def test_parses_vllm_gauges_summing_engines_and_taking_the_fullest_cache():
    sample = parse_engine_metrics(VLLM_TEXT, 5.0, 8)
    assert (sample.waiting, sample.running, sample.kv_cache, sample.scraped_at) == (5.0, 7.0, 0.9, 5.0)
    assert sample.mean_prompt_tokens is None  # no request_prompt_tokens histogram exported


def test_the_mean_prompt_comes_from_vllms_finished_requests_histogram():
    text = VLLM_TEXT + (
        "# TYPE vllm:request_prompt_tokens histogram\n"
        'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="x"} 3.0\n'
        'vllm:request_prompt_tokens_count{engine="0",model_name="x"} 3.0\n'
        'vllm:request_prompt_tokens_sum{engine="0",model_name="x"} 3000.0\n'
        'vllm:request_prompt_tokens_bucket{engine="1",le="+Inf",model_name="x"} 1.0\n'
        'vllm:request_prompt_tokens_count{engine="1",model_name="x"} 1.0\n'
        'vllm:request_prompt_tokens_sum{engine="1",model_name="x"} 5000.0\n'
    )
    assert parse_engine_metrics(text, 5.0, 8).mean_prompt_tokens == 2000.0  # 8,000 over 4 requests


@pytest.mark.parametrize("text", ["# TYPE other gauge\nother 1\n", "garbage{{{ 1 2 3"])
def test_metrics_without_the_waiting_gauge_are_an_error(text):
    with pytest.raises(EngineScrapeError):
        parse_engine_metrics(text, 0.0, 8)


# --- fastest serverless -------------------------------------------------------------------

FASTEST = ModelConfig(
    serverless=(S1, S2, S3), routing=RoutingConfig(serverless="fastest", min_samples=20, explore_percent=0)
)


@pytest.mark.parametrize(
    ("ttft", "order"),
    [
        ({}, (S1, S2, S3)),  # nothing measured: configured order
        ({"m/s1": figures(900), "m/s2": figures(300), "m/s3": figures(600)}, (S2, S3, S1)),
        ({"m/s2": figures(300, cv=1.5), "m/s3": figures(500)}, (S3, S2, S1)),  # cold starts penalised
        ({"m/s3": figures(100), "m/s2": figures(50, samples=5)}, (S3, S1, S2)),  # too few samples
    ],
)
def test_fastest_orders_serverless_by_live_p95_ttft(ttft, order):
    policy = registry.build("dedicated_first", FASTEST)
    decision = policy.decide(context(), Snapshot(0.0, ttft=ttft), (D1, S1, S2, S3))
    assert decision.targets == (D1, *order)


def test_fastest_sends_the_explore_share_of_keys_to_unmeasured_routes_first():
    model = FASTEST.model_copy(update={"routing": RoutingConfig(serverless="fastest", explore_percent=10)})
    policy = registry.build("dedicated_first", model)
    snapshot = Snapshot(0.0, ttft={"m/s1": figures(900), "m/s3": figures(600)})
    firsts = [policy.decide(context(f"u{i}"), snapshot, (S1, S2, S3)).targets[0] for i in range(2000)]
    share = firsts.count(S2) / len(firsts)
    assert 0.07 <= share <= 0.13
    assert set(firsts) == {S2, S3}


# --- wait in line for a dedicated slot ------------------------------------------------------

QUEUED = ModelConfig(serverless=(S1,), routing=RoutingConfig(max_queue_ms=500))
FULL = {"d1": 4}


@pytest.mark.parametrize(
    ("model", "snapshot", "targets", "reason", "queue_ms"),
    [
        (ModelConfig(serverless=(S1,)), Snapshot(0.0, in_flight=FULL), (S1,), Reason.SATURATED, 0),
        (QUEUED, Snapshot(0.0, in_flight=FULL), (D1, S1), Reason.BASELINE, 500),  # no figures: bound decides
        # expected wait (1 ahead + me) x 400 ms / 4 slots = 200 ms < serverless p95 1000 ms: wait
        (
            QUEUED,
            Snapshot(
                0.0,
                in_flight=FULL,
                waiting={"d1": 1},
                e2e={"m/d1": figures(800, mean=400)},
                ttft={"m/s1": figures(1000)},
            ),
            (D1, S1),
            Reason.BASELINE,
            500,
        ),
        # 9 ahead: 10 x 400 / 4 = 1000 ms, beyond the bound: spill
        (
            QUEUED,
            Snapshot(
                0.0,
                in_flight=FULL,
                waiting={"d1": 9},
                e2e={"m/d1": figures(800, mean=400)},
                ttft={"m/s1": figures(1000)},
            ),
            (S1,),
            Reason.SATURATED,
            0,
        ),
        # serverless answers faster than the expected wait: spill
        (
            QUEUED,
            Snapshot(0.0, in_flight=FULL, e2e={"m/d1": figures(800, mean=400)}, ttft={"m/s1": figures(50)}),
            (S1,),
            Reason.SATURATED,
            0,
        ),
    ],
)
def test_waits_in_line_only_when_it_should_beat_serverless(model, snapshot, targets, reason, queue_ms):
    decision = registry.build("dedicated_first", model).decide(context(), snapshot, (D1, S1))
    assert (decision.targets, decision.reason, decision.queue_ms) == (targets, reason, queue_ms)
