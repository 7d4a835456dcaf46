"""Retry outcomes and the retry budget: the budget as a pure counter, outcomes through a real
gateway in front of simulators with injected faults."""

from __future__ import annotations

import logging

import openai
import orjson
import pytest

from router.app import create_app
from router.config import RetryConfig, parse_config
from router.record.records import ACCESS_LOG
from router.request.budget import retry_budget
from tests.conftest import dedicated_profile, serverless_profile
from tests.servers import Sim, ThreadServer


def test_budget_allows_its_share_of_requests_plus_the_minimum():
    budget = retry_budget(RetryConfig(budget_percent=20, budget_window_s=10, min_retries=2))
    for _ in range(50):
        budget.request(now=100.0)
    granted = sum(budget.try_spend(now=100.5) for _ in range(30))
    assert granted == 10  # 20% of 50


def test_budget_always_allows_the_minimum():
    budget = retry_budget(RetryConfig(budget_percent=20, min_retries=2))
    budget.request(now=5.0)
    assert [budget.try_spend(now=5.0) for _ in range(3)] == [True, True, False]


def test_budget_refills_as_the_window_slides():
    budget = retry_budget(RetryConfig(budget_percent=100, budget_window_s=2, min_retries=0))
    budget.request(now=10.0)
    assert budget.try_spend(now=10.0) and not budget.try_spend(now=10.5)
    budget.request(now=12.5)  # the first request and its retry have left the 2 s window
    assert budget.try_spend(now=12.5)


def config_for(ded: Sim, sls: list[Sim], model_extra: str = ""):
    serverless = ", ".join(f"{{name: sl{i}, base_url: '{s.base_url}', model: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0}}" for i, s in enumerate(sls))
    return parse_config(
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        f"{model_extra}"
        f"    dedicated: [{{name: ded, gpu_hour_usd: 0, base_url: '{ded.base_url}', model: d, max_concurrency: 4}}]\n"
        f"    serverless: [{serverless}]\n",
        {},
    )


def call(url: str, stream: bool = False) -> tuple[int, dict[str, str]]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    try:
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=[], max_tokens=2, stream=True
            )
            list(raw.parse())
        else:
            raw = client.chat.completions.with_raw_response.create(model="m", messages=[], max_tokens=2)
        return raw.status_code, dict(raw.headers)
    except openai.APIStatusError as exc:
        return exc.status_code, dict(exc.response.headers)


@pytest.mark.parametrize(
    ("ded_faults", "sl_faults", "status", "outcome", "route", "attempts"),
    [
        ({}, {}, {200}, "first_try", "ded", "1"),
        ({"error_rate": 1.0}, {}, {200}, "failed_over_ok", "sl0", "2"),
        ({"rate_limit_rate": 1.0, "retry_after_s": 0.01}, {}, {200}, "failed_over_ok", "sl0", "2"),
        # the last upstream error is relayed: the simulator answers 500 or 503
        ({"error_rate": 1.0}, {"error_rate": 1.0}, {500, 503}, "exhausted", None, "3"),
        ({"reject_rate": 1.0}, {}, {400}, "client_error", "ded", "1"),  # a 400 is never retried
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_outcomes(ded_faults, sl_faults, status, outcome, route, attempts, stream):
    with Sim(dedicated_profile()) as ded, Sim(serverless_profile()) as sl:
        ded.configure(faults=ded_faults)
        sl.configure(faults=sl_faults)
        with ThreadServer(
            create_app(config_for(ded, [sl], "    retry: {attempts: 3, backoff_ms: 1}\n"))
        ) as gw:
            got_status, headers = call(gw.url, stream)
    assert got_status in status
    assert headers["x-tidegate-outcome"] == outcome
    assert headers["x-tidegate-attempts"] == attempts
    if route is not None:
        assert headers["x-tidegate-route"] == route


def test_a_spent_budget_stops_retries_of_the_same_endpoint_and_says_so(caplog):
    with Sim(dedicated_profile()) as ded:
        ded.configure(faults={"error_rate": 1.0})
        config = config_for(
            ded, [], "    retry: {attempts: 3, backoff_ms: 1, budget_percent: 0, min_retries: 0}\n"
        )
        with ThreadServer(create_app(config)) as gw, caplog.at_level(logging.INFO, logger=ACCESS_LOG):
            status, headers = call(gw.url)
        attempts_seen = sum(ded.stats()["faults"].values())
    assert status in {500, 503}
    assert (headers["x-tidegate-outcome"], headers["x-tidegate-attempts"]) == ("exhausted", "1")
    assert attempts_seen == 1
    (line,) = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOG]
    assert line["retry_budget_denied"] is True and line["outcome"] == "exhausted"


def test_failover_to_another_endpoint_is_not_limited_by_the_budget():
    with Sim(dedicated_profile()) as ded, Sim(serverless_profile()) as sl:
        ded.configure(faults={"error_rate": 1.0})
        config = config_for(ded, [sl], "    retry: {attempts: 2, budget_percent: 0, min_retries: 0}\n")
        with ThreadServer(create_app(config)) as gw:
            status, headers = call(gw.url)
    assert status == 200 and headers["x-tidegate-outcome"] == "failed_over_ok"
