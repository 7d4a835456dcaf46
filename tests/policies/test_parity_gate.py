"""The parity gate (policies/parity.py): with enforce, a diverging serverless endpoint leaves
the spill order; dedicated endpoints, other models and the decision's reason are untouched."""

from __future__ import annotations

from dataclasses import replace

from policies import registry
from policies.base import Reason, RequestContext
from policies.parity import ParityGate
from policies.types import Snapshot
from router.config import DedicatedEndpoint, ModelConfig, ServerlessEndpoint
from router.config.model import ParityConfig

D = DedicatedEndpoint(gpu_hour_usd=0, name="d", base_url="http://d/v1", model="m", max_concurrency=2)
S1 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s1", base_url="http://s1/v1", model="m")
S2 = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s2", base_url="http://s2/v1", model="m")
CANDIDATES = (D, S1, S2)
CONTEXT = RequestContext("m", False, "k")


def names(found):
    return [c.name for c in found]


def test_without_enforce_or_verdicts_nothing_changes():
    diverging = Snapshot(now=0.0, parity_diverges={"m": frozenset({"s1"})})
    assert ParityGate(False).filter(CONTEXT, diverging, CANDIDATES) == (CANDIDATES, None)
    assert ParityGate(True).filter(CONTEXT, Snapshot(now=0.0), CANDIDATES) == (CANDIDATES, None)
    other_model = Snapshot(now=0.0, parity_diverges={"other": frozenset({"s1"})})
    assert ParityGate(True).filter(CONTEXT, other_model, CANDIDATES) == (CANDIDATES, None)


def test_a_diverging_serverless_endpoint_is_removed_and_dedicated_kept():
    snapshot = Snapshot(now=0.0, parity_diverges={"m": frozenset({"s1", "d"})})
    kept, reason = ParityGate(True).filter(CONTEXT, snapshot, CANDIDATES)
    assert names(kept) == ["d", "s2"] and reason is None


def test_the_gate_never_empties_the_candidates():
    snapshot = Snapshot(now=0.0, parity_diverges={"m": frozenset({"s1", "s2"})})
    assert names(ParityGate(True).filter(CONTEXT, snapshot, (S1, S2))[0]) == ["s1", "s2"]
    assert names(ParityGate(True).filter(CONTEXT, snapshot, CANDIDATES)[0]) == ["d"]


def test_in_the_pipeline_spills_skip_it_and_baseline_keeps_its_reason():
    model = ModelConfig(parity=ParityConfig(enforce=True), dedicated=(D,), serverless=(S1, S2))
    policy = registry.build("dedicated_first", model)
    snapshot = Snapshot(now=0.0, parity_diverges={"m": frozenset({"s1"})})
    room = policy.decide(CONTEXT, snapshot, CANDIDATES)
    assert names(room.targets) == ["d", "s2"] and room.reason is Reason.BASELINE
    full = policy.decide(CONTEXT, replace(snapshot, in_flight={"d": 2}), CANDIDATES)
    assert names(full.targets)[0] == "s2" and "s1" not in names(full.targets)
    unenforced = registry.build("dedicated_first", ModelConfig(dedicated=(D,), serverless=(S1, S2)))
    assert "s1" in names(
        unenforced.decide(CONTEXT, replace(snapshot, in_flight={"d": 2}), CANDIDATES).targets
    )
