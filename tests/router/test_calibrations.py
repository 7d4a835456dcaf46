"""The named calibrations (issue 28, part 1): every dedicated calibration has the same model's
API as a partner, the figures are physical, and each pair sits in the regime the docs say it
does on the Azure traces' request sizes (docs/economics.md)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from router.economics.cost import break_even_utilization, token_cost_usd
from tidegate.offline.calibration import DEDICATED, PARTNERS, SERVERLESS, DedicatedCalibration
from tidegate.offline.planner.plans import Plan, System
from tidegate.offline.planner.sweep import evaluate
from tidegate.offline.replay import Arrival, load, window

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def _slice(name: str) -> list[Arrival]:
    return window(load(TRACES / f"AzureLLMInferenceTrace_{name}_20min.csv"), 0.0, 20.0)


def _break_even(dedicated: str, serverless: str, rows: list[Arrival]) -> float:
    d, s = DEDICATED[dedicated], SERVERLESS[serverless]
    mean_in = statistics.fmean(a.input_tokens for a in rows)
    mean_out = statistics.fmean(a.output_tokens for a in rows)
    task_usd = token_cost_usd(mean_in, mean_out, s.usd_per_mtok_in, s.usd_per_mtok_out)
    found = break_even_utilization(d.usd_per_hour, d.tasks_per_hour(mean_in, mean_out), task_usd)
    assert found is not None
    return found


def test_every_dedicated_calibration_names_partners_that_exist():
    assert set(PARTNERS) == set(DEDICATED)
    for name, partners in PARTNERS.items():
        assert partners, name
        assert all(p in SERVERLESS for p in partners), name


@pytest.mark.parametrize("name", sorted(DEDICATED))
def test_the_figures_are_physical(name: str):
    d: DedicatedCalibration = DEDICATED[name]
    assert d.prefill_tokens_per_s > 0 and d.itl_s > 0 and d.itl_per_seq_s >= 0
    assert d.max_num_seqs > 0 and d.gpus > 0 and d.gpu_hour_usd > 0
    # a full engine decodes more per second than one sequence alone, and never past its ceiling
    assert 1 / d.itl_s < d.decode_capacity_tokens_per_s <= d.decode_tokens_per_s


# the cheapest public prices for the same models: a replica would have to be busier than it can be
NEVER_WINS = {("llama-8b-h100", "llama-8b-groq"), ("llama-8b-h100", "llama-8b-deepinfra")}


@pytest.mark.parametrize("trace", ["code", "conv"])
@pytest.mark.parametrize(
    ("dedicated", "serverless"),
    [
        (d, s)
        for d, partners in PARTNERS.items()
        if d != "deepseek-r1-h200"
        for s in partners
        if (d, s) not in NEVER_WINS
    ],
)
def test_an_open_weight_replica_busy_enough_is_cheaper_than_its_api(dedicated, serverless, trace):
    """The regime tidegate exists for: some utilization well under 100% makes a dedicated task
    cheaper than the API's, at the field notes' $4.41/GPU-hour."""
    assert _break_even(dedicated, serverless, _slice(trace)) < 0.65


@pytest.mark.parametrize("trace", ["code", "conv"])
@pytest.mark.parametrize(("dedicated", "serverless"), sorted(NEVER_WINS))
def test_against_the_cheapest_partners_a_replica_never_wins(dedicated, serverless, trace):
    """Groq's $0.05/$0.08 and DeepInfra's $0.02/$0.03 for Llama 3.1 8B: break-even at or past
    a replica's whole capacity (docs/economics.md says so per partner)."""
    assert _break_even(dedicated, serverless, _slice(trace)) > 0.95


@pytest.mark.parametrize("trace", ["code", "conv"])
def test_the_deepseek_node_never_beats_its_api(trace):
    """The other regime, as docs/replay-and-plan.md says: at an H200 rate ($6.31) no
    utilization makes the 8xH200 node cheaper per task than DeepSeek's API, on either trace."""
    assert _break_even("deepseek-r1-h200", "deepseek-serverless", _slice(trace)) > 1.0


def test_capacity_adds_the_prefill_and_decode_seconds_of_a_task():
    """Prefill and decode share the replica's steps (router/engine/spec.py), so a task's
    seconds add: capacity is under both the prefill-only and the decode-only bound."""
    d = DEDICATED["llama-8b-h100"]
    for mean_in, mean_out in ((10_000, 1), (1, 10_000), (1_000, 250)):
        found = d.tasks_per_hour(mean_in, mean_out)
        prefill_only = d.prefill_tokens_per_s / mean_in * 3600
        decode_only = d.engine.decode_capacity_tokens_per_s(mean_in, mean_out) / mean_out * 3600
        assert found < min(prefill_only, decode_only)
        assert 1 / found == pytest.approx(1 / prefill_only + 1 / decode_only, rel=1e-9), (mean_in, mean_out)


def test_the_planner_finds_the_8b_replica_cheaper_than_its_api_at_twice_the_conv_rate():
    """The model agrees with the arithmetic: at a load over break-even a plan with the
    replica costs less per SLO-successful task than all-serverless (and meets the SLO)."""
    rows = _slice("conv")
    doubled = sorted(
        rows + [Arrival(a.at_s + 0.5, a.input_tokens, a.output_tokens) for a in rows],
        key=lambda a: a.at_s,
    )
    system = System(DEDICATED["llama-8b-h100"], SERVERLESS["llama-8b-together"])
    span_s = 1200.0
    serverless = evaluate(doubled, Plan(0), system, slo_ttft_ms=2000, span_s=span_s)
    hybrid = evaluate(doubled, Plan(1, 64), system, slo_ttft_ms=2000, span_s=span_s)
    assert hybrid["slo_attainment"] >= 0.95
    assert hybrid["cost_per_slo_success_usd"] < serverless["cost_per_slo_success_usd"]
