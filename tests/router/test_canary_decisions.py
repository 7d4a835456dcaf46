"""The canary controller's decisions as pure functions: the plan, each check, the verdict and
the step it leads to (the acceptance with real parts: tests/integration/test_canary_controller.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from router.canary.analysis import LATENCY_CHECKS, Side, Verdict, analyse, check_name
from router.canary.run import CanaryConflict, CanaryRun, admin_action, decide
from router.config import CanaryChecks, CanaryControllerConfig, ConfigError, parse_config

HEALTHY = Side(
    requests=100,
    errors=0,
    successes=99,
    ttft_p95_ms=100,
    itl_p50_ms=20,
    cost_usd=1.0,
    successful_tasks=99,
    e2e_per_token_p95_ms=25,
)
SERVERLESS = HEALTHY
# the same traffic, none of it streamed: no TTFT, no ITL, e2e per output token on both sides
NON_STREAMING = replace(HEALTHY, ttft_p95_ms=None, itl_p50_ms=None)
CONFIG = CanaryControllerConfig(steps=(5, 10, 25, 50, 100), interval_s=300, min_samples=75)


def test_the_plan_from_steps_or_a_step_size():
    assert CONFIG.plan() == (5, 10, 25, 50, 100)
    assert CanaryControllerConfig(step_percent=30).plan() == (30, 60, 90, 100)
    assert CanaryControllerConfig(step_percent=25, max_percent=50).plan() == (25, 50)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({}, "give steps"),
        ({"steps": [10, 5]}, "rise strictly"),
        ({"steps": [10], "step_percent": 5}, "not both"),
    ],
)
def test_a_plan_that_cannot_be_walked_is_refused(settings, problem):
    with pytest.raises(ValueError, match=problem):
        CanaryControllerConfig(**settings)


def test_a_canary_needs_both_sides():
    text = """
auth: {allow_anonymous: true}
models:
  m:
    canary: {steps: [10, 100]}
    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: "http://s/v1", model: x}]
"""
    with pytest.raises(ConfigError, match=r"models\.m\.canary: .* needs at least one of each"):
        parse_config(text, {})


def test_healthy_figures_pass_every_check():
    analysis = analyse(HEALTHY, SERVERLESS, CanaryChecks(cost_per_success_max_ratio=1.0), 75)
    assert analysis.verdict is Verdict.PASS
    assert {c.result for c in analysis.checks} == {"pass"}
    assert len(analysis.checks) == 6


@pytest.mark.parametrize(
    ("dedicated", "check"),
    [
        (Side(100, 0, 99, 130, 20, 1.0, 99), "ttft_p95_ratio"),  # 1.3x serverless p95 TTFT
        (Side(100, 0, 99, 100, 31, 1.0, 99), "itl_p50_ratio"),
        (Side(100, 2, 98, 100, 20, 1.0, 98), "error_rate_percent"),  # 2% > 1%
        (Side(100, 0, 90, 100, 20, 1.0, 90), "success_rate_ratio"),  # 0.909 < 0.98
    ],
)
def test_each_check_fails_on_its_own_figure(dedicated, check):
    analysis = analyse(dedicated, SERVERLESS, CanaryChecks(), 75)
    assert analysis.verdict is Verdict.FAIL
    assert [c.name for c in analysis.checks if c.result == "fail"] == [check]
    assert check in analysis.reason


def test_thin_data_holds_on_latency_but_errors_still_fail():
    thin_slow = Side(10, 0, 10, 500, 20, 1.0, 10)
    assert analyse(thin_slow, SERVERLESS, CanaryChecks(), 75).verdict is Verdict.INCONCLUSIVE
    thin_erroring = Side(10, 5, 5, 100, 20, 1.0, 5)
    assert analyse(thin_erroring, SERVERLESS, CanaryChecks(), 75).verdict is Verdict.FAIL
    no_ttft = Side(100, 0, 99, None, 20, 1.0, 99)
    assert analyse(no_ttft, SERVERLESS, CanaryChecks(), 75).verdict is Verdict.INCONCLUSIVE


def test_non_streaming_traffic_alone_can_pass_on_e2e_per_token():
    analysis = analyse(NON_STREAMING, NON_STREAMING, CanaryChecks(ttft_p95_max_ms=2000), 75)
    assert analysis.verdict is Verdict.PASS, analysis.reason
    results = {c.name: c.result for c in analysis.checks}
    assert results["e2e_per_token_p95_ratio"] == "pass"
    assert {results[n] for n in ("ttft_p95_ratio", "itl_p50_ratio", "ttft_p95_ms")} == {"skipped"}


def test_non_streaming_traffic_fails_on_a_slow_dedicated_side():
    slow = replace(NON_STREAMING, e2e_per_token_p95_ms=40)  # 1.6x serverless
    analysis = analyse(slow, NON_STREAMING, CanaryChecks(), 75)
    assert analysis.verdict is Verdict.FAIL
    assert [c.name for c in analysis.checks if c.result == "fail"] == ["e2e_per_token_p95_ratio"]


def test_no_latency_compared_at_all_is_not_a_pass():
    without = CanaryChecks(e2e_per_token_p95_max_ratio=None)  # and no request streamed
    analysis = analyse(NON_STREAMING, NON_STREAMING, without, 75)
    assert analysis.verdict is Verdict.INCONCLUSIVE
    assert "ttft_p95_ratio" in analysis.reason and "itl_p50_ratio" in analysis.reason


def test_a_latency_one_side_lacks_is_missing_not_skipped():
    streamed_on_one_side = replace(NON_STREAMING, ttft_p95_ms=100)
    analysis = analyse(streamed_on_one_side, NON_STREAMING, CanaryChecks(), 75)
    assert analysis.verdict is Verdict.INCONCLUSIVE
    assert {c.name: c.result for c in analysis.checks}["ttft_p95_ratio"] == "no_data"


def test_decisions_step_hold_and_roll_back():
    run = CanaryRun("progressing", 0, 5.0, 0, 0.0, 0.0, 0.0)
    passed = analyse(HEALTHY, SERVERLESS, CanaryChecks(), 75)
    failed = analyse(Side(100, 5, 95, 100, 20, 1.0, 95), SERVERLESS, CanaryChecks(), 75)
    held = analyse(Side(3, 0, 3, 100, 20, 1.0, 3), SERVERLESS, CanaryChecks(), 75)
    up, action = decide(run, passed, CONFIG, now=1000.0)
    assert (action, up.step, up.percent, up.next_at) == ("step_up", 1, 10, 1300.0)
    same, action = decide(up, held, CONFIG, now=1300.0)
    assert (action, same.percent, same.failures) == ("hold", 10, 0)
    once, action = decide(same, failed, CONFIG, now=1600.0)
    assert (action, once.percent, once.failures, once.state) == ("hold_failed", 10, 1, "progressing")
    back, action = decide(once, failed, CONFIG, now=1900.0)
    assert (action, back.percent, back.state) == ("rollback", 0.0, "rolled_back")
    hold_config = CanaryControllerConfig(steps=(5, 100), on_failure="hold", failure_threshold=1)
    paused, action = decide(run, failed, hold_config, now=1.0)
    assert (action, paused.state, paused.percent) == ("pause", "paused", 5.0)


def test_the_last_step_promotes():
    run = CanaryRun("progressing", 3, 50.0, 0, 0.0, 0.0, 0.0)
    done, action = decide(run, analyse(HEALTHY, SERVERLESS, CanaryChecks(), 75), CONFIG, now=1.0)
    assert (action, done.state, done.percent, done.next_at) == ("promote", "promoted", 100, None)


def test_admin_actions_refuse_what_does_not_apply():
    idle = CanaryRun()
    with pytest.raises(CanaryConflict):
        admin_action(idle, "pause", CONFIG, 1.0)
    with pytest.raises(CanaryConflict):
        admin_action(idle, "resume", CONFIG, 1.0)
    started = admin_action(idle, "start", CONFIG, 1.0)
    assert (started.state, started.percent, started.next_at) == ("progressing", 5, 301.0)
    with pytest.raises(CanaryConflict):
        admin_action(started, "start", CONFIG, 1.0)
    assert admin_action(started, "promote", CONFIG, 2.0).percent == 100
    assert admin_action(started, "abort", CONFIG, 2.0).percent == 0


def test_the_parity_check_holds_a_passing_analysis_only_when_enforced():
    from router.canary.analysis import with_parity  # noqa: PLC0415

    passing = analyse(HEALTHY, SERVERLESS, CanaryChecks(), 75)
    assert passing.verdict is Verdict.PASS
    held = with_parity(passing, ["ded"], tested=True, enforce=True)
    assert held.verdict is Verdict.INCONCLUSIVE and "parity" in held.reason and "ded" in held.reason
    assert [c.result for c in held.checks if c.name == "parity"] == ["fail"]
    shown = with_parity(passing, ["ded"], tested=True, enforce=False)
    assert shown.verdict is Verdict.PASS and [c.result for c in shown.checks if c.name == "parity"] == ["fail"]
    clean = with_parity(passing, [], tested=True, enforce=True)
    assert clean.verdict is Verdict.PASS and [c.result for c in clean.checks if c.name == "parity"] == ["pass"]
    assert with_parity(passing, [], tested=False, enforce=True) == passing  # no parity run: no check
    failed = analyse(Side(100, 5, 95, 100, 20, 1.0, 95), SERVERLESS, CanaryChecks(), 75)
    assert with_parity(failed, ["ded"], tested=True, enforce=True).verdict is Verdict.FAIL  # stays failed


def test_every_canary_checks_field_is_one_check_named_after_it():
    """The config's field names are the one declaration: a field the analysis ignored, or a
    check with no field, fails here."""
    every = CanaryChecks(**{field: 1.0 for field in CanaryChecks.model_fields})
    names = sorted(c.name for c in analyse(HEALTHY, SERVERLESS, every, 75).checks)
    assert names == sorted(check_name(field) for field in CanaryChecks.model_fields)
    assert names == sorted(set(names))  # no two fields make one check
    assert set(names) >= LATENCY_CHECKS
