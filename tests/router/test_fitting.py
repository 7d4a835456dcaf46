"""tidegate/offline/fitting.py: the calibrations `tidegate plan` fits to a gateway's figures."""

from __future__ import annotations

import random
import statistics

import pytest

from tidegate.offline.calibration import DEDICATED, SERVERLESS
from tidegate.offline.fitting import fit_to_routes, probe_ttft, ttft_from_quantiles


def test_a_fitted_ttft_reproduces_the_quantiles_it_was_fitted_to() -> None:
    ttft = ttft_from_quantiles(400.0, 1200.0, (10.0, 90.0))
    rng = random.Random(7)
    samples = sorted(ttft.sample(rng) * 1000 for _ in range(40_000))
    assert statistics.median(samples) == pytest.approx(400.0, rel=0.03)
    assert samples[int(0.95 * len(samples))] == pytest.approx(1200.0, rel=0.05)


@pytest.mark.parametrize(("p50", "p95"), [(0.0, 10.0), (500.0, 400.0)])
def test_quantiles_that_describe_no_distribution_are_refused(p50: float, p95: float) -> None:
    with pytest.raises(ValueError, match="cannot describe a distribution"):
        ttft_from_quantiles(p50, p95, (10.0, 90.0))


def test_route_figures_set_the_prefill_rate_the_decode_step_and_the_serverless_ttft() -> None:
    d, s = next(iter(DEDICATED.values())), next(iter(SERVERLESS.values()))
    routes = {
        "ded": {"kind": "dedicated", "requests": 10, "tokens_in": 20_000, "ttft_ms": {"p50": 1000 * d.overhead_s + 500}, "itl_p50_ms": 25.0},
        "sl": {"kind": "serverless", "requests": 5, "ttft_ms": {"p50": 300.0, "p95": 900.0}},
        "idle": {"kind": "serverless", "requests": 0, "ttft_ms": {}},
    }
    fitted_d, fitted_s, notes = fit_to_routes(routes, d, s)
    assert fitted_d.prefill_tokens_per_s == pytest.approx(2000 / 0.5)  # 2,000-token prompts in 0.5 s
    assert fitted_d.itl_s == pytest.approx(0.025)
    assert fitted_s.ttft.p50_s == pytest.approx(0.3)
    assert len(notes) == 3 and not any("idle" in note for note in notes)


def test_no_route_figures_fit_nothing() -> None:
    d, s = next(iter(DEDICATED.values())), next(iter(SERVERLESS.values()))
    assert fit_to_routes({}, d, s) == (d, s, [])


def test_a_probe_result_must_name_one_endpoint() -> None:
    found = {"endpoints": [{"endpoint": "a", "ttft_ms": {"median": 200, "p95": 500}}, {"endpoint": "b", "ttft_ms": {"median": 300, "p95": 600}}]}
    with pytest.raises(ValueError, match="measured: a, b"):
        probe_ttft(found, None, (10.0, 90.0))
    assert probe_ttft(found, "b", (10.0, 90.0)).p50_s == pytest.approx(0.3)
