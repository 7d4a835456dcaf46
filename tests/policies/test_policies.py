"""Policies are pure: tables of (candidates, in-flight) -> (targets, reason)."""

from __future__ import annotations

import pytest

from policies import registry
from policies.base import Policy, Reason, RequestContext
from policies.types import Snapshot
from router.config import DedicatedEndpoint, ModelConfig, PlacementConfig, RoutingConfig, ServerlessEndpoint

D1 = DedicatedEndpoint(gpu_hour_usd=0, name="d1", base_url="http://d1/v1", model="x", max_concurrency=2)
D2 = DedicatedEndpoint(gpu_hour_usd=0, name="d2", base_url="http://d2/v1", model="x", max_concurrency=1)
S1 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s1", base_url="http://s1/v1", model="x")
S2 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s2", base_url="http://s2/v1", model="x")
MODEL = ModelConfig(serverless=(S1,))
CONTEXT = RequestContext("m", stream=False, stickiness_key=None)


@pytest.mark.parametrize(
    ("candidates", "in_flight", "targets", "reason"),
    [
        ((D1, S1, S2), {}, (D1, S1, S2), Reason.BASELINE),
        ((D1, S1, S2), {"d1": 1}, (D1, S1, S2), Reason.BASELINE),
        ((D1, S1, S2), {"d1": 2}, (S1, S2), Reason.SATURATED),
        ((D1, D2, S1), {"d1": 2}, (D2, S1), Reason.BASELINE),
        ((D1, D2, S1), {"d1": 2, "d2": 1}, (S1,), Reason.SATURATED),
        ((D1,), {"d1": 2}, (D1,), Reason.SATURATED),
        ((S1, S2), {}, (S1, S2), Reason.SERVERLESS_ONLY),
    ],
)
def test_dedicated_first(candidates, in_flight, targets, reason):
    decision = registry.build("dedicated_first", MODEL).decide(
        CONTEXT, Snapshot(now=0.0, in_flight=in_flight), candidates
    )
    assert decision.targets == targets
    assert decision.reason is reason


DEDICATED_ONLY = ModelConfig(routing=RoutingConfig(max_queue_ms=500, placement=PlacementConfig(mode="listed")))


@pytest.mark.parametrize(
    ("in_flight", "targets", "reason"),
    [
        ({}, (D1, D2), Reason.BASELINE),
        ({"d1": 2}, (D2, D1), Reason.BASELINE),  # the free pool first, the full one still tried
        ({"d1": 2, "d2": 1}, (D1, D2), Reason.SATURATED),
    ],
)
def test_with_nowhere_to_spill_a_request_waits_in_line_whatever_the_snapshot_says(in_flight, targets, reason):
    """The snapshot lags the leases: a pool it shows full or free may be either by the time of
    the acquire, so without a spill route the model's wait in line always applies."""
    decision = registry.build("dedicated_first", DEDICATED_ONLY).decide(
        CONTEXT, Snapshot(now=0.0, in_flight=in_flight), (D1, D2)
    )
    assert (decision.targets, decision.reason, decision.queue_ms) == (targets, reason, 500)


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(KeyError, match="known: dedicated_first"):
        registry.build("fastest-ever", MODEL)


def keyed(key: str) -> RequestContext:
    return RequestContext("m", stream=False, stickiness_key=key)


def canary_policy(percent: float) -> Policy:
    return registry.build("dedicated_first", ModelConfig(canary_percent=percent, serverless=(S1,)))


KEYS = [f"user-{i}" for i in range(2000)]


@pytest.mark.parametrize(("percent", "low", "high"), [(0, 0, 0), (30, 0.27, 0.33), (100, 1, 1)])
def test_canary_sends_its_share_of_keys_to_dedicated(percent, low, high):
    policy = canary_policy(percent)
    decisions = [policy.decide(keyed(k), Snapshot(now=0.0), (D1, S1)) for k in KEYS]
    on_dedicated = sum(d.targets[0] is D1 for d in decisions) / len(KEYS)
    assert low <= on_dedicated <= high
    assert {d.reason for d in decisions if d.targets[0] is S1} <= {Reason.CANARY_OUT}


def test_raising_the_canary_never_moves_a_key_off_dedicated():
    eligible_before = set()
    for percent in (5, 25, 50, 75):
        policy = canary_policy(percent)
        now = {k for k in KEYS if policy.decide(keyed(k), Snapshot(0.0), (D1, S1)).targets[0] is D1}
        assert eligible_before <= now
        eligible_before = now


def test_live_canary_override_in_the_snapshot_wins_over_config():
    policy = canary_policy(100)
    decision = policy.decide(keyed("k"), Snapshot(0.0, canary_percent={"m": 0}), (D1, S1))
    assert (decision.targets, decision.reason) == ((S1,), Reason.CANARY_OUT)


@pytest.mark.parametrize("percent", [0, 10, 50])
def test_a_canary_exempt_request_is_eligible_for_dedicated_whatever_its_bucket(percent):
    policy = canary_policy(percent)
    for k in KEYS[:200]:
        context = RequestContext("m", False, k, canary_exempt=True)
        decision = policy.decide(context, Snapshot(0.0, canary_percent={"m": percent}), (D1, S1))
        assert decision.targets[0] is D1, k
        assert decision.reason is not Reason.CANARY_OUT


def test_canary_keeps_dedicated_when_there_is_nowhere_else():
    decision = canary_policy(0).decide(keyed("k"), Snapshot(0.0), (D1,))
    assert (decision.targets, decision.reason) == ((D1,), Reason.BASELINE)


@pytest.mark.parametrize("percent", [0, 30, 99.99])
def test_canary_says_nothing_for_a_model_with_no_dedicated(percent):
    """A serverless-only model's traffic is `serverless_only` whatever the canary says: it
    was never eligible for dedicated, so it did not spill (and is not in the spill figures)."""
    policy = canary_policy(percent)
    reasons = {policy.decide(keyed(k), Snapshot(0.0), (S1, S2)).reason for k in KEYS[:200]}
    assert reasons == {Reason.SERVERLESS_ONLY}
