"""The named calibrations (issue 28, part 1): every dedicated calibration has the same model's
API as a partner, the figures are physical, and each pair sits in the regime the docs say it
does on the Azure traces' request sizes (docs/economics.md)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from router.economics.cost import break_even_utilization, token_cost_usd
from router.offline.calibration import DEDICATED, PARTNERS, SERVERLESS, DedicatedCalibration
from router.offline.planner.plans import Plan, System
from router.offline.planner.sweep import evaluate
from router.offline.replay import Arrival, load, window

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


@pytest.mark.parametrize("trace", ["code", "conv"])
@pytest.mark.parametrize(
    ("dedicated", "serverless"),
    [(d, s) for d, partners in PARTNERS.items() if d != "deepseek-r1-h200" for s in partners],
)
def test_an_open_weight_replica_busy_enough_is_cheaper_than_its_api(dedicated, serverless, trace):
    """The regime tidegate exists for: some utilization under 100% makes a dedicated task
    cheaper than the API's, at the field notes' $4.41/GPU-hour."""
    assert _break_even(dedicated, serverless, _slice(trace)) < 0.5


def test_the_deepseek_node_never_beats_its_api_on_code_prompts():
    """The other regime, as docs/replay-and-plan.md says: on 2k-token prompts no utilization
    makes the 8xH200 node cheaper per task than DeepSeek's API."""
    assert _break_even("deepseek-r1-h200", "deepseek-serverless", _slice("code")) > 1.0


def test_capacity_is_the_tighter_of_prefill_and_decode():
    d = DEDICATED["llama-8b-h100"]
    prefill_bound = d.tasks_per_hour(10_000, 1)
    assert prefill_bound == pytest.approx(d.prefill_tokens_per_s / 10_000 * 3600)
    decode_bound = d.tasks_per_hour(1, 10_000)
    assert decode_bound == pytest.approx(d.decode_capacity_tokens_per_s / 10_000 * 3600)


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
