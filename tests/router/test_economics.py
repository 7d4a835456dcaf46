"""The cost model reproduces the field notes' arithmetic exactly, and prices provisioned time
(schedules included) to the second."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from router.economics.cost import (
    ScheduledReplicas,
    break_even_utilization,
    cost_per_task_at,
    monthly_cost_usd,
    per_success,
    provisioned_cost_usd,
    replica_seconds,
    token_cost_usd,
)


def test_the_field_notes_arithmetic():
    monthly = monthly_cost_usd(gpus=1, gpu_hour_usd=4.41)
    assert monthly == pytest.approx(3175.20, abs=1e-9)  # $4.41 per H100-hour x 720 h
    assert round(cost_per_task_at(monthly, tasks_per_min_capacity=100, utilization=0.08), 5) == 0.00919
    assert round(cost_per_task_at(monthly, tasks_per_min_capacity=100, utilization=0.70), 5) == 0.00105


def test_token_and_provisioned_costs():
    assert token_cost_usd(1_000_000, 500_000, 0.55, 2.19) == pytest.approx(0.55 + 1.095)
    assert provisioned_cost_usd(gpus=8, gpu_hour_usd=4.41, replica_seconds=1800) == pytest.approx(17.64)
    assert per_success(10.0, 0) is None
    assert per_success(10.0, 4) == 2.5


def test_break_even_is_where_a_dedicated_task_costs_a_serverless_one():
    # $4.41/h, 6000 tasks/h at full use, serverless $0.0012 per task: break-even at 61.25%
    u = break_even_utilization(4.41, 6000, 0.0012)
    assert u == pytest.approx(4.41 / (6000 * 0.0012))
    assert 4.41 / (6000 * u) == pytest.approx(0.0012)  # at u, the same price per task
    assert break_even_utilization(4.41, 0, 0.0012) is None
    assert break_even_utilization(4.41, 6000, 0.0) is None


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_replica_seconds_follow_the_schedule_across_midnight():
    night_off = [ScheduledReplicas(20 * 3600, 8 * 3600, 0.0)]  # scaled to zero 20:00-08:00 UTC
    day = replica_seconds(_at("2026-03-02T00:00:00"), _at("2026-03-03T00:00:00"), 1.0, night_off)
    assert day == 12 * 3600  # 08:00-20:00 only
    span = replica_seconds(_at("2026-03-02T19:00:00"), _at("2026-03-02T21:30:00"), 2.0, night_off)
    assert span == 3600 * 2  # 19:00-20:00 at 2 replicas, then none
    busy = [ScheduledReplicas(9 * 3600, 17 * 3600, 3.0)]
    assert (
        replica_seconds(_at("2026-03-02T08:00:00"), _at("2026-03-02T10:00:00"), 1.0, busy) == 3600 + 3 * 3600
    )
    assert replica_seconds(10.0, 10.0, 1.0, busy) == 0.0


@pytest.mark.parametrize(
    ("schedule", "problem"),
    [
        (
            [
                {"start": "08:00", "end": "20:00", "replicas": 2},
                {"start": "19:00", "end": "21:00", "replicas": 1},
            ],
            "overlap",
        ),
        (
            [
                {"start": "22:00", "end": "06:00", "replicas": 0},
                {"start": "05:00", "end": "07:00", "replicas": 1},
            ],
            "overlap",
        ),
        ([{"start": "8:00", "end": "20:00", "replicas": 2}], "HH:MM"),
        ([{"start": "08:00", "end": "08:00", "replicas": 2}], "empty"),
        ([{"start": "08:00", "end": "09:00", "replicas": -1}], "greater than or equal"),
        (  # Friday's night window runs into Saturday's morning one
            [
                {"start": "22:00", "end": "06:00", "replicas": 0, "days": ["fri"]},
                {"start": "05:00", "end": "09:00", "replicas": 1, "days": ["sat"]},
            ],
            "overlap",
        ),
        ([{"start": "08:00", "end": "09:00", "replicas": 1, "days": ["mon", "mon"]}], "named twice"),
        ([{"start": "08:00", "end": "09:00", "replicas": 1, "days": ["monday"]}], "days"),
    ],
)
def test_a_schedule_that_cannot_be_priced_is_refused(schedule, problem):
    from router.config import ConfigError, parse_config  # noqa: PLC0415

    endpoint = {"name": "d", "gpu_hour_usd": 0, "base_url": "http://d/v1", "model": "m", "max_concurrency": 1, "schedule": schedule}
    text = orjson.dumps(
        {"auth": {"allow_anonymous": True}, "models": {"m": {"dedicated": [endpoint]}}}
    ).decode()
    with pytest.raises(ConfigError) as refused:
        parse_config(text, {})
    assert problem in str(refused.value)
    assert "models.m.dedicated[0]" in str(refused.value)


def test_a_schedule_on_some_days_prices_those_days_only():
    # weekdays 08:00-20:00 at 2 replicas; the base count is 0 (2026-03-02 is a Monday)
    weekdays = [ScheduledReplicas(8 * 3600, 20 * 3600, 2.0, frozenset(range(5)))]
    week = replica_seconds(_at("2026-03-02T00:00:00"), _at("2026-03-09T00:00:00"), 0.0, weekdays)
    assert week == 5 * 12 * 3600 * 2
    saturday = replica_seconds(_at("2026-03-07T00:00:00"), _at("2026-03-08T00:00:00"), 0.0, weekdays)
    assert saturday == 0
    # a window crossing midnight belongs to the day it starts on
    friday_night = [ScheduledReplicas(22 * 3600, 6 * 3600, 1.0, frozenset({4}))]
    saturday_morning = replica_seconds(
        _at("2026-03-07T00:00:00"), _at("2026-03-07T12:00:00"), 0.0, friday_night
    )
    assert saturday_morning == 6 * 3600
    thursday_night = replica_seconds(
        _at("2026-03-05T12:00:00"), _at("2026-03-06T12:00:00"), 0.0, friday_night
    )
    assert thursday_night == 0


def test_windows_on_different_days_may_share_their_hours():
    from router.config import parse_config  # noqa: PLC0415
    from router.economics.costs import schedule_of  # noqa: PLC0415

    schedule = [
        {"start": "08:00", "end": "20:00", "replicas": 2, "days": ["mon", "tue", "wed", "thu", "fri"]},
        {"start": "08:00", "end": "20:00", "replicas": 1, "days": ["sat"]},
    ]
    endpoint = {"name": "d", "gpu_hour_usd": 0, "base_url": "http://d/v1", "model": "m", "max_concurrency": 1, "replicas": 0}
    text = orjson.dumps(
        {
            "auth": {"allow_anonymous": True},
            "models": {"m": {"dedicated": [endpoint | {"schedule": schedule}]}},
        }
    ).decode()
    [dedicated] = parse_config(text, {}).models["m"].dedicated
    assert [e.days for e in schedule_of(dedicated)] == [frozenset(range(5)), frozenset({5})]
