"""The report's schedule from live traffic (issue 28, part 3): per hour of the week, the
replicas that pay for themselves by the break-even rule, written as config."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from router.economics.schedule import break_even_counts, recommended_schedule, weekly_demand

MONDAY = int(datetime(2026, 3, 2, tzinfo=UTC).timestamp())


def _slices(hours: dict[int, float], days: int = 7, step_s: int = 600) -> list[tuple[int, float]]:
    """Slices over `days` from Monday, each hour of the week busy `hours[h]` requests in flight."""
    return [
        (start, hours.get((start - MONDAY) // 3600 % 168, 0.0) * step_s)
        for start in range(MONDAY, MONDAY + days * 86400, step_s)
    ]


def test_weekly_demand_is_the_mean_in_flight_per_hour_of_the_week():
    demand = weekly_demand(_slices({9: 12.0, 33: 6.0}))
    assert demand[9] == pytest.approx(12.0) and demand[33] == pytest.approx(6.0) and demand[10] == 0.0
    two_weeks = _slices({9: 12.0}, days=14)
    quiet_second_monday = [(s, b if s < MONDAY + 7 * 86400 else 0.0) for s, b in two_weeks]
    assert weekly_demand(quiet_second_monday)[9] == pytest.approx(6.0)  # the mean of two Mondays
    one_day = weekly_demand(_slices({9: 12.0}, days=1))
    assert one_day[9] == pytest.approx(12.0) and one_day[24 + 9] is None  # Tuesday not in the window


def test_a_replica_counts_where_the_demand_left_for_it_beats_the_break_even():
    # 16 slots a replica, break-even 25%: 2.5 replicas' worth -> 3 (the third is 50% busy);
    # 1.2 -> 1 (a second would be 20% busy); 0.3 -> 1; 0.2 -> 0
    demand = [2.5 * 16, 1.2 * 16, 0.3 * 16, 0.2 * 16] + [None] * 164
    counts = break_even_counts(demand, 16, 0.25)
    assert counts[:4] == [3, 1, 1, 0]
    assert counts[24:28] == [3, 1, 1, 0]  # hours the window did not cover: the same time of day


def test_the_report_recommends_office_hours_and_nothing_where_dedicated_cannot_pay():
    series = _slices({d * 24 + h: 20.0 for d in range(5) for h in range(9, 18)})
    found = recommended_schedule("pool", 16, 0.3, series)
    assert found is not None
    schedule, line = found
    assert schedule["config"]["replicas"] == 0
    assert schedule["config"]["schedule"] == [
        {"start": "09:00", "end": "18:00", "replicas": 1, "days": ["mon", "tue", "wed", "thu", "fri"]}
    ]
    assert "45 of the week's 168 hours" in line and "tidegate plan" in line
    assert recommended_schedule("pool", 16, 1.2, series) is None  # over 100%: never pays
    assert recommended_schedule("pool", 16, None, series) is None
