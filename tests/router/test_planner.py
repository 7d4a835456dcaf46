"""`tidegate plan`'s model and choices (issue 17): the discrete-event model against hand-worked
cases of the simulator's rules, the choice of plan, the Pareto front and the break-even price."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import yaml

from router.config import ConfigError
from tidegate.offline.calibration import DEDICATED, SERVERLESS, TtftDistribution
from tidegate.offline.planner.model import (
    SERVERLESS_ROUTE,
    Plan,
    System,
    dedicated_route,
    keep_warm_groups,
    simulate,
    simulate_keep_warm,
)
from tidegate.offline.planner.sweep import Grid, break_even, choose, evaluate, pareto, sweep
from tidegate.offline.replay import Arrival, load, window
from tidegate.offline.timelapse import scale_config

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
D = DEDICATED["deepseek-r1-h200"]
# a serverless route with a fixed TTFT (no spread) so the cases below can be worked by hand
S = dataclasses.replace(
    SERVERLESS["deepseek-serverless"], ttft=TtftDistribution(0.5, 0.0, cold_range_s=(20.0, 20.0))
)
SYSTEM = System(D, S)


B = 1 / D.prefill_tokens_per_s  # a prompt token's share of its step


def test_a_lone_request_is_prefilled_in_chunked_steps_then_decodes_one_token_per_step():
    [r] = simulate([Arrival(0.0, 16_500, 11)], Plan(1, 16), SYSTEM)
    assert r["route"] == dedicated_route(0)
    # 8,192 + 8,192 + 116 prompt tokens: three steps, each with its fixed part
    assert r["ttft_ms"] == pytest.approx(1000 * (3 * D.itl_s + 16_500 * B + D.overhead_s))
    step = D.itl_s + D.itl_per_seq_s * 1
    assert r["e2e_ms"] == pytest.approx(r["ttft_ms"] + 1000 * 10 * step)


def test_prompts_arriving_together_share_steps_in_order_and_slow_the_sequences_decoding_beside_them():
    rows = [Arrival(0.0, 8_250, 2), Arrival(0.0, 8_250, 2), Arrival(0.0, 16_500, 2)]
    first, second, third = simulate(rows, Plan(1, 16), SYSTEM)
    s1 = s2 = D.itl_s + 8192 * B  # the first's 8,192, then its last 58 and the second's 8,134
    s3 = D.itl_s + D.itl_per_seq_s + 8191 * B  # the first decodes; the second's last 116, the third's 8,075
    s4 = D.itl_s + D.itl_per_seq_s + 8191 * B  # the second decodes; the third's next 8,191
    s5 = D.itl_s + 234 * B  # the third's last 234
    overhead = 1000 * D.overhead_s
    assert first["ttft_ms"] == pytest.approx(1000 * (s1 + s2) + overhead)
    assert first["e2e_ms"] == pytest.approx(1000 * (s1 + s2 + s3) + overhead)  # one decode step, a long one
    assert second["ttft_ms"] == pytest.approx(1000 * (s1 + s2 + s3) + overhead)
    assert third["ttft_ms"] == pytest.approx(1000 * (s1 + s2 + s3 + s4 + s5) + overhead)


def test_a_full_pool_spills_at_once_without_a_wait_in_line():
    rows = [Arrival(0.0, 1000, 100), Arrival(0.01, 1000, 100)]
    first, second = simulate(rows, Plan(1, 1), SYSTEM)
    assert first["route"] == dedicated_route(0) and first["reason"] == "baseline"
    assert second["route"] == SERVERLESS_ROUTE and second["reason"] == "saturated"
    assert second["ttft_ms"] == pytest.approx(500)


def test_a_wait_in_line_takes_the_slot_when_it_frees_in_time_and_spills_when_it_does_not():
    quick = [Arrival(0.0, 1000, 2), Arrival(0.01, 1000, 2)]
    _, waited = simulate(quick, Plan(1, 1, max_queue_ms=5000), SYSTEM)
    assert waited["route"] == dedicated_route(0)
    first_done_s = D.itl_s + 1000 * B + D.itl_s + D.itl_per_seq_s
    assert waited["ttft_ms"] > 1000 * (first_done_s - 0.01)  # it waited for the first to finish
    slow = [Arrival(0.0, 1000, 2000), Arrival(0.01, 1000, 2)]
    _, spilled = simulate(slow, Plan(1, 1, max_queue_ms=200), SYSTEM)
    assert spilled["route"] == SERVERLESS_ROUTE and spilled["reason"] == "saturated"
    assert spilled["ttft_ms"] == pytest.approx(200 + 500)  # the whole wait, then serverless


def test_the_second_replica_takes_what_the_first_has_no_slot_for():
    rows = [Arrival(0.0, 100, 50), Arrival(0.0, 100, 50), Arrival(0.0, 100, 50)]
    routes = [r["route"] for r in simulate(rows, Plan(2, 1), SYSTEM)]
    assert routes == [dedicated_route(0), dedicated_route(1), SERVERLESS_ROUTE]


def test_the_canary_sends_its_share_to_dedicated():
    rows = [Arrival(i * 10.0, 100, 2) for i in range(2000)]
    records = simulate(rows, Plan(1, 64, canary_percent=30), SYSTEM, seed=3)
    share = sum(r["route"] == dedicated_route(0) for r in records) / len(records)
    assert 0.26 < share < 0.34
    assert {r["reason"] for r in records if r["route"] == SERVERLESS_ROUTE} == {"canary_out"}


def test_serverless_is_cold_after_an_idle_gap_longer_than_its_scale_to_zero():
    gap = S.idle_to_cold_s
    rows = [Arrival(0.0, 10, 2), Arrival(1.0, 10, 2), Arrival(1.0 + gap + 1, 10, 2), Arrival(gap + 3, 10, 2)]
    ttfts = [r["ttft_ms"] for r in simulate(rows, Plan(0), SYSTEM)]
    # the fourth arrives a second into the third's 20 s cold load and waits for the rest of it
    assert ttfts == pytest.approx([500, 500, 20_500, 19_500])


def test_every_request_arriving_during_a_cold_load_waits_for_its_end():
    gap, load_s = S.idle_to_cold_s, 20.0
    burst = [Arrival(gap + 10 + i * 0.5, 10, 2) for i in range(50)]  # 25 s of requests after idle
    records = simulate([Arrival(0.0, 10, 2), *burst], Plan(0), SYSTEM)
    ready = gap + 10 + load_s
    for r, a in zip(records[1:], burst, strict=True):
        expected_ms = (max(ready, a.at_s) - a.at_s + 0.5) * 1000
        assert r["ttft_ms"] == pytest.approx(expected_ms), a.at_s


def test_the_model_is_deterministic_for_a_seed_and_answers_every_row():
    rows = window(load(TRACES / "AzureLLMInferenceTrace_code_20min.csv"), 3, 2)
    one = simulate(rows, Plan(1, 16, 250, 75), System(D, SERVERLESS["deepseek-serverless"]), seed=5)
    two = simulate(rows, Plan(1, 16, 250, 75), System(D, SERVERLESS["deepseek-serverless"]), seed=5)
    assert one == two and len(one) == len(rows)
    assert all(r["e2e_ms"] >= r["ttft_ms"] > 0 for r in one)


def _result(name: str, attainment: float, per_success: float | None) -> dict:
    return {"plan": name, "slo_attainment": attainment, "cost_per_slo_success_usd": per_success}


def test_the_cheapest_plan_meeting_the_target_wins_and_the_reasons_name_the_others():
    results = [
        _result("cheap but slow", 0.90, 0.001),
        _result("best", 0.97, 0.002),
        _result("runner-up", 0.99, 0.003),
    ]
    verdict = choose(results, target=0.95)
    assert verdict["chosen"] == "best" and verdict["runner_up"] == "runner-up"
    assert "50.0% more" in verdict["why"] and "cheap but slow" in verdict["why"]
    assert choose(results, target=0.999)["chosen"] is None
    assert pareto(results) == ["cheap but slow", "best", "runner-up"]
    assert pareto([*results, _result("dominated", 0.96, 0.0025)]) == ["cheap but slow", "best", "runner-up"]


def test_at_its_break_even_gpu_price_a_plan_costs_what_all_serverless_does_per_success():
    rows = window(load(TRACES / "AzureLLMInferenceTrace_conv_20min.csv"), 0, 3)
    system = System(D, SERVERLESS["deepseek-serverless"])
    figures = {"slo_ttft_ms": 2000.0, "span_s": 180.0}
    plan, baseline = Plan(1, 64), evaluate(rows, Plan(0), system, **figures)
    found = evaluate(rows, plan, system, **figures)
    price = break_even(found, baseline, system)["gpu_hour_usd"]
    assert price is not None and 0 < price < D.gpu_hour_usd
    at_price = evaluate(
        rows,
        plan,
        dataclasses.replace(system, dedicated=dataclasses.replace(D, gpu_hour_usd=price)),
        **figures,
    )
    per = at_price["cost_usd"] / (at_price["slo_attainment"] * at_price["requests"])
    base = baseline["cost_usd"] / (baseline["slo_attainment"] * baseline["requests"])
    assert per == pytest.approx(base, rel=1e-3)


def test_the_grid_holds_all_serverless_once_and_every_combination_otherwise():
    plans = Grid(
        replicas=(0, 1, 2),
        max_concurrency=(8, 16),
        max_queue_ms=(0,),
        canary_percent=(100, 50),
        keep_warm_s=(0,),
    ).plans()
    assert plans.count(Plan(0)) == 1 and len(plans) == 1 + 2 * 2 * 2
    assert len({p.label for p in plans}) == len(plans)
    # the default grid also tries a kept-warm serverless route: every plan once with it
    default = Grid().plans()
    assert {p.keep_warm_s for p in default} == {0.0, 30.0}
    assert len(default) == 2 * len([p for p in default if p.keep_warm_s == 0])


CONFIG = """
auth: {allow_anonymous: true, admin_key: "${ADMIN_KEY}"}
models:
  m:
    routing: {max_queue_ms: 1000}
    slo: {ttft_p95_ms: 2000}
    dedicated: [{name: d, gpu_hour_usd: 0, base_url: "http://127.0.0.1:1/v1", model: x, max_concurrency: 4}]
    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: "http://127.0.0.1:2/v1", model: x, timeouts: {ttft_s: 30}}]
"""


def test_a_time_lapsed_config_divides_every_time_constant_and_keeps_secrets_as_references():
    env = {"ADMIN_KEY": "k" * 32}
    text = scale_config(CONFIG + "state: {window_s: 100}\n", 5, env)
    raw = yaml.safe_load(text)
    assert raw["time_scale"] == 5
    assert raw["auth"]["admin_key"] == "${ADMIN_KEY}"  # not the secret's value
    model = raw["models"]["m"]
    assert model["routing"]["max_queue_ms"] == 200
    assert model["slo"]["dwell_s"] == 2  # a default, made explicit and divided
    assert model["serverless"][0]["timeouts"]["ttft_s"] == 6
    assert model["dedicated"][0]["timeouts"]["ttft_s"] == 12
    assert raw["state"]["window_s"] == 20


def test_a_time_lapse_scales_the_slo_the_budget_and_the_prefill_priors_alike():
    """At speed K the gateway measures and learns in wall time: every TTFT K times shorter and
    the prefill rate K times higher. Targets and priors are scaled with them, so a prediction
    against a budget decides as it would in trace time."""
    text = CONFIG.replace("slo: {ttft_p95_ms: 2000}", "slo: {ttft_p95_ms: 2000, ttft_budget_ms: 1500}")
    text = text.replace("  m:\n", "  m:\n    canary: {steps: [10, 50], checks: {ttft_p95_max_ms: 3000}}\n")
    raw = yaml.safe_load(scale_config(text, 4, {"ADMIN_KEY": "k" * 32}))
    model = raw["models"]["m"]
    assert (model["slo"]["ttft_p95_ms"], model["slo"]["ttft_budget_ms"]) == (500, 375)
    assert model["canary"]["checks"]["ttft_p95_max_ms"] == 750
    dedicated = model["dedicated"][0]
    assert (dedicated["prefill_tokens_per_s"], dedicated["ttft_overhead_ms"]) == (
        32_000,
        12.5,
    )  # defaults 8000, 50
    trace_ms = 50 + 12_000 / 8000 * 1000  # a 12k-token queue, predicted in trace time
    wall_ms = dedicated["ttft_overhead_ms"] + 12_000 / dedicated["prefill_tokens_per_s"] * 1000
    assert wall_ms == pytest.approx(trace_ms / 4)


def test_a_time_lapse_divides_the_hedge_delay_and_window():
    text = scale_config(
        CONFIG.replace("  m:\n", "  m:\n    hedge: {after_ms: 1000}\n"), 4, {"ADMIN_KEY": "k" * 32}
    )
    hedge = yaml.safe_load(text)["models"]["m"]["hedge"]
    assert (hedge["after_ms"], hedge["window_s"]) == (250, 15)  # window_s: the default 60, made explicit


def test_a_time_lapse_below_a_constants_floor_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="window_s"):
        scale_config(CONFIG, 10, {"ADMIN_KEY": "k" * 32})  # 60 s / 10 is under the 10 s slice


def test_predicted_admission_admits_while_the_prefill_fits_and_spills_the_rest_at_once():
    # full 8,192-token chunks drain at 8,192 / (18.6 ms + 8,192 / 16,500 s) = 15,904 tokens/s: three
    # 16,500-token prompts at once are predicted at 1.12, 2.16 and 3.19 s with the 80 ms
    rows = [Arrival(0.0, 16_500, 2) for _ in range(3)]
    records = simulate(rows, Plan(1, 256, ttft_budget_ms=2_500), SYSTEM)
    assert [r["route"] for r in records] == [dedicated_route(0), dedicated_route(0), SERVERLESS_ROUTE]
    assert records[2]["reason"] == "predicted_slow"
    # the second's 16,500 tokens ride in five steps after the first's, one beside the first's last token
    expected_s = 5 * D.itl_s + D.itl_per_seq_s + 33_000 * B + D.overhead_s
    assert records[1]["ttft_ms"] == pytest.approx(1000 * expected_s)


def test_predicted_admission_beats_every_fixed_cap_on_the_bursty_slice_and_matches_the_best_on_the_steady():
    """The model's view of issue 18's first acceptance line, on the trace slices kept here:
    admission against the prefill queue, with a serverless route that stays warm (a
    scale-to-zero one: the test below). The budget is 3/4 of the SLO: the prediction reads the
    decode batch at admission, and prompts admitted later lengthen every step after it (with
    the shared-step engine a budget at the SLO attains 0.958 on the code slice, a cap of 16 0.996)."""
    system = System(D, dataclasses.replace(SERVERLESS["deepseek-serverless"], idle_to_cold_s=0.0))
    figures = {"slo_ttft_ms": 2000.0, "span_s": 600.0}
    for name, start in (("code", 0), ("conv", 0)):
        rows = window(load(TRACES / f"AzureLLMInferenceTrace_{name}_20min.csv"), start, 10)
        caps = [evaluate(rows, Plan(1, c), system, **figures) for c in (16, 32, 64)]
        predicted = evaluate(rows, Plan(1, 256, ttft_budget_ms=1500), system, **figures)
        best = max(caps, key=lambda r: (r["slo_attainment"], -r["cost_usd"]))
        assert predicted["slo_attainment"] >= best["slo_attainment"], (name, predicted, best)
        cheapest = min(r["cost_per_slo_success_usd"] for r in caps)
        assert predicted["cost_per_slo_success_usd"] <= cheapest * 1.03, name


@pytest.mark.parametrize("start", [0, 40])
def test_predicted_admission_beats_every_fixed_cap_with_a_scale_to_zero_spill_route(start):
    """Issue 28, part 4, in the model: the held-out code slices (bursts after idle minutes),
    serverless scaling to zero after 60 s with 10-30 s loads, two seeds each. The policy has no
    per-trace knob: the budget is the SLO."""
    figures = {"slo_ttft_ms": 2000.0, "span_s": 1200.0}
    rows = window(load(TRACES / "AzureLLMInferenceTrace_code.csv"), start, 20)
    system = System(D, SERVERLESS["deepseek-serverless"])
    assert system.serverless.idle_to_cold_s > 0

    def mean(plan, key):
        return sum(evaluate(rows, plan, system, seed=seed, **figures)[key] for seed in (0, 1)) / 2

    caps = {c: Plan(1, c) for c in (8, 16, 32)}
    predicted = Plan(1, 64, ttft_budget_ms=2000.0)
    best = max(caps.values(), key=lambda p: mean(p, "slo_attainment"))
    assert mean(predicted, "slo_attainment") >= mean(best, "slo_attainment")
    assert mean(predicted, "cost_per_slo_success_usd") <= mean(best, "cost_per_slo_success_usd")


def test_the_model_takes_arrivals_in_time_order_whatever_order_they_are_given_in():
    rows = window(load(TRACES / "AzureLLMInferenceTrace_code_20min.csv"), 0, 3)
    plan = Plan(1, 8, 250.0)
    in_order = simulate(rows, plan, SYSTEM, seed=3)
    shuffled = list(reversed(rows))
    reversed_records = simulate(shuffled, plan, SYSTEM, seed=3)
    assert reversed_records[0]["at_s"] == rows[-1].at_s  # one record per row, in the rows' order
    for r in in_order:
        r.pop("index")
    for r in reversed_records:
        r.pop("index")
    assert list(reversed(reversed_records)) == in_order


def test_keep_warm_pings_keep_serverless_warm_and_are_priced_as_spend():
    gap = S.idle_to_cold_s
    rows = [Arrival(0.0, 10, 2), Arrival(3 * gap, 10, 2)]
    cold = evaluate(rows, Plan(0), SYSTEM, slo_ttft_ms=2000.0, span_s=4 * gap)
    warm = evaluate(rows, Plan(0, keep_warm_s=gap / 2), SYSTEM, slo_ttft_ms=2000.0, span_s=4 * gap)
    assert cold["ttft_ms"]["p99"] > 20_000 and warm["ttft_ms"]["p99"] < 1000
    assert warm["keep_warm_usd"] == pytest.approx(
        7 * (8 * S.usd_per_mtok_in + S.usd_per_mtok_out) / 1e6, abs=1e-6
    )
    assert warm["cost_usd"] == pytest.approx(cold["cost_usd"] + warm["keep_warm_usd"])


def test_utilization_counts_only_slot_time_inside_the_span_and_all_serverless_has_no_pool_settings():
    # one request of 100 s of decoding arriving at the end of a 10 s span: 10 s of it was paid
    rows = [Arrival(0.0, 10, 2), Arrival(9.0, 10, 10_000)]
    found = evaluate(rows, Plan(1, 1), SYSTEM, slo_ttft_ms=2000.0, span_s=10.0)
    assert 0 < found["dedicated_utilization"] <= 1
    serverless = evaluate(rows, Plan(0), SYSTEM, slo_ttft_ms=2000.0, span_s=10.0)
    assert serverless["settings"]["max_concurrency"] is None
    assert serverless["settings"]["admission"] is None and serverless["dedicated_utilization"] is None


def test_the_pareto_plot_marks_the_chosen_plan_and_the_runner_up(tmp_path):
    from tidegate.cli.plan_output import _key, pareto_plot  # noqa: PLC0415

    rows = window(load(TRACES / "AzureLLMInferenceTrace_conv_20min.csv"), 0, 2)
    results = [
        evaluate(rows, p, SYSTEM, slo_ttft_ms=2000.0, span_s=120.0) for p in Grid(replicas=(0, 1)).plans()
    ]
    found = {
        "plans": results,
        "pareto": pareto(results),
        "slo": {"ttft_ms": 2000.0, "target_attainment": 0.95},
    }
    found |= choose(results, 0.95)
    assert pareto_plot(found, tmp_path / "p.png").startswith("Pareto plot")
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    edge = sorted(
        (r for r in results if r["plan"] in found["pareto"]), key=lambda r: r["cost_per_slo_success_usd"]
    )
    key = _key(edge, found)
    assert f"{found['chosen']} (chosen)" in key and f"{found['runner_up']} (runner-up)" in key


def test_the_chosen_plan_is_never_hidden_under_the_runner_up():
    """Two plans at the same point: the chosen star is drawn on top, the runner-up diamond is
    hollow, and the pixel at that point is the star's red."""
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from tidegate.cli.plan_output import pareto_figure  # noqa: PLC0415

    def plan(name: str, cost: float, attainment: float) -> dict:
        return {"plan": name, "cost_per_slo_success_usd": cost, "slo_attainment": attainment,
                "cost_usd": cost * 1000, "settings": {"replicas": 1}}  # fmt: skip

    plans = [plan("a", 0.002, 0.97), plan("b", 0.002, 0.97), plan("c", 0.004, 0.99), plan("d", 0.001, 0.5)]
    found = {"plans": plans, "pareto": ["d", "a", "c"], "chosen": "a", "runner_up": "b",
             "slo": {"ttft_ms": 2000.0, "target_attainment": 0.95}}  # fmt: skip
    fig = pareto_figure(found)
    try:
        ax = fig.axes[0]
        marks = {c.get_label(): c for c in ax.collections}
        others = [a.get_zorder() for a in [*ax.collections, *ax.lines] if a is not marks["chosen"]]
        assert marks["chosen"].get_zorder() > max(others)
        assert marks["runner-up"].get_facecolor().size == 0 or marks["runner-up"].get_facecolor()[0][3] == 0
        fig.canvas.draw()
        x, y = ax.transData.transform((2.0, 97.0))  # cost per 1,000 tasks, attainment in %
        pixels = np.asarray(fig.canvas.buffer_rgba())
        r, g, b = pixels[round(float(pixels.shape[0] - y)), round(float(x))][:3]
        assert (r, g, b) == (0xD6, 0x27, 0x28), (r, g, b)  # the chosen star's red, not the diamond
    finally:
        plt.close(fig)


def test_the_figures_do_not_depend_on_how_many_processes_model_them():
    rows = window(load(TRACES / "AzureLLMInferenceTrace_code_20min.csv"), 3, 1)
    plans = Grid(replicas=(0, 1), max_concurrency=(8, 16), max_queue_ms=(0,), canary_percent=(100,)).plans()
    counted: list[int] = []
    alone = sweep(rows, plans, SYSTEM, slo_ttft_ms=2000.0, span_s=60.0)
    shared = sweep(
        rows, plans, SYSTEM, slo_ttft_ms=2000.0, span_s=60.0, jobs=2, progress=counted.append
    )
    assert shared == alone and sum(counted) == len(plans)


@pytest.mark.parametrize("gap_s", [0.0, 90.0])
def test_keep_warm_variants_modelled_in_one_run_are_what_each_plan_gives_alone(gap_s):
    """One run stands for its keep-warm variants only when serverless never went cold: with a
    90 s hole in the traffic (past the 60 s scale-to-zero) each variant runs, and differs."""
    busy = window(load(TRACES / "AzureLLMInferenceTrace_conv_20min.csv"), 0, 1)
    rows = [*busy, *(Arrival(a.at_s + 60 + gap_s, a.input_tokens, a.output_tokens) for a in busy)]
    system = System(DEDICATED["llama-8b-h100"], SERVERLESS["llama-8b-together"])
    for base in (Plan(0), Plan(1, 4, 250)):
        plans = [base, dataclasses.replace(base, keep_warm_s=30.0), dataclasses.replace(base, keep_warm_s=20.0)]
        together = simulate_keep_warm(rows, plans, system, seed=2)
        alone = [simulate(rows, plan, system, seed=2) for plan in plans]
        assert together == alone
        assert (together[0] == together[1]) is (gap_s == 0.0)
    groups = keep_warm_groups([Plan(1, 4, keep_warm_s=30.0), Plan(0), Plan(1, 4), Plan(0, keep_warm_s=30.0)])
    assert groups == [[2, 0], [1, 3]]


def test_a_time_window_keeps_its_mean_and_percentiles_as_values_come_and_go():
    from tidegate.offline.stats import TimeWindow, percentile  # noqa: PLC0415

    rng = random.Random(4)
    window, kept = TimeWindow(), []
    for step in range(2_000):
        value = rng.expovariate(1.0)
        window.append(float(step), value)
        kept.append((float(step), value))
        window.drop_before(step - 100.0)
        kept = [(at, v) for at, v in kept if at >= step - 100.0]
        if step % 97 == 0:
            values = [v for _, v in kept]
            assert len(window) == len(values)
            assert window.mean() == pytest.approx(sum(values) / len(values))
            for q in (50, 95):
                assert window.percentile(q) == percentile(values, q)


def test_a_prefix_hit_rate_lowers_the_prefill_a_replica_computes():
    """System.prefix_hit_rate (tidegate plan --prefix-hit-rate): that share of each dedicated
    prompt skips its prefill, so long prompts reach their first token sooner on the same plan."""
    rows = [Arrival(i * 0.5, 20_000, 4) for i in range(60)]  # prefill-bound: long prompts, no spill
    plan = Plan(1, 64)
    cold = evaluate(rows, plan, SYSTEM, slo_ttft_ms=2000.0, span_s=30.0)
    warm = dataclasses.replace(SYSTEM, prefix_hit_rate=0.8)
    cached = evaluate(rows, plan, warm, slo_ttft_ms=2000.0, span_s=30.0)
    assert cold["spill_share"] == cached["spill_share"] == 0.0  # the same replica serves both
    assert cached["ttft_ms"]["p50"] < cold["ttft_ms"]["p50"] / 5
    assert cached["slo_attainment"] > cold["slo_attainment"]
    assert cached["dedicated_utilization"] < cold["dedicated_utilization"]
