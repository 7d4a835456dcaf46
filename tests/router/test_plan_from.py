"""`tidegate plan --from URL` (issue 28, part 3): each hour's volume from a gateway's rollups,
each hour's inside from a trace."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from tidegate.cli.plan_from import hourly_requests
from tidegate.offline.replay import load
from tidegate.offline.synth import synthesize_hours

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
MONDAY_9 = 1_767_603_600  # 2026-01-05 09:00 UTC


def _report(series: dict[str, list[list[object]]]) -> dict[str, object]:
    return {"models": {"m": {"routes": {"ded": {}, "sl": {}}}}, "series": {"slice_s": 60, "routes": series}}


def test_hourly_requests_sum_the_routes_per_utc_hour_with_quiet_hours_as_zero():
    series = {
        "m/ded": [[MONDAY_9, {"requests": 10.0}], [MONDAY_9 + 60, {"requests": 5.0}]],
        "m/sl": [[MONDAY_9 + 120, {"requests": 2.0}], [MONDAY_9 + 2 * 3600 + 30, {"requests": 7.0}]],
        "other/ded": [[MONDAY_9, {"requests": 1000.0}]],  # another model's: not counted
    }
    start, hours = hourly_requests(_report(series), "m")
    assert start == datetime(2026, 1, 5, 9, 0)
    assert hours == [17.0, 0.0, 7.0]
    # quiet slices before the first request and after the last do not start or end the hours
    series["m/ded"] = [
        [MONDAY_9 - 7200, {"requests": 0.0}],
        *series["m/ded"],
        [MONDAY_9 + 5 * 3600, {"requests": 0.0}],
    ]
    assert hourly_requests(_report(series), "m") == (start, hours)


@pytest.mark.parametrize(
    ("report", "message"),
    [
        (_report({}), "no requests"),
        (_report({"m/ded": [[MONDAY_9, {"requests": 0.0}]]}), "no requests"),
        ({"models": {}, "series": {"routes": {}}}, "no routes for model 'm'"),
    ],
)
def test_a_window_without_the_models_traffic_is_a_clear_error(report, message):
    with pytest.raises(ValueError, match=message):
        hourly_requests(report, "m")


def test_synthesized_hours_carry_each_hours_volume_and_the_traces_sizes():
    source = load(TRACES / "AzureLLMInferenceTrace_conv_20min.csv")
    hours = list(synthesize_hours(source, [2_000.0, 0.0, 6_000.0], seed=1))
    assert [len(h) for h in hours][1] == 0
    assert len(hours[0]) == pytest.approx(2_000, rel=0.05) and len(hours[2]) == pytest.approx(6_000, rel=0.05)
    assert all(2 * 3600 <= a.at_s < 3 * 3600 for a in hours[2])
    sizes = {(a.input_tokens, a.output_tokens) for a in source}
    assert all((a.input_tokens, a.output_tokens) in sizes for h in hours for a in h)
    with pytest.raises(ValueError, match="no requests"):
        synthesize_hours(source, [0.0, 0.0])
    with pytest.raises(ValueError, match=">= 0"):
        synthesize_hours(source, [1.0, -1.0])
