"""Policies are pure: tables of (candidates, in-flight) -> (targets, reason)."""

from __future__ import annotations

import pytest

from policies import registry
from policies.base import Reason, RequestContext
from router.config import DedicatedEndpoint, ModelConfig, ServerlessEndpoint
from router.state.base import Snapshot

D1 = DedicatedEndpoint(name="d1", base_url="http://d1/v1", model="x", max_concurrency=2)
D2 = DedicatedEndpoint(name="d2", base_url="http://d2/v1", model="x", max_concurrency=1)
S1 = ServerlessEndpoint(name="s1", base_url="http://s1/v1", model="x")
S2 = ServerlessEndpoint(name="s2", base_url="http://s2/v1", model="x")
CONTEXT = RequestContext("m", ModelConfig(serverless=(S1,)), stream=False, stickiness_key=None)


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
    decision = registry.build("dedicated_first").decide(
        CONTEXT, Snapshot(now=0.0, in_flight=in_flight), candidates
    )
    assert decision.targets == targets
    assert decision.reason is reason


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(KeyError, match="known: dedicated_first"):
        registry.build("fastest-ever")
