"""The fast tier: a request's walk over its targets, in-process (tests/router/asgi.py). Each
row is what the upstreams answer, and what the client and the record must then say: the
route, reason, outcome and attempt count of docs/routing.md and docs/api.md
(retries and failover), and the error rows of the errors table. Every row also checks that no slot is left held."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import orjson
import pytest

from router.state.slots import Slots
from tests.router.asgi import (
    Handler,
    MockUpstreams,
    answers,
    asgi_gateway,
    chat_reply,
    cut_stream_reply,
    error_reply,
    model_yaml,
    stream_reply,
)


async def stall(request: httpx.Request) -> httpx.Response:
    await asyncio.sleep(5)  # past every endpoint's ttft_s (0.2 s) in these tests
    return chat_reply()


CONNECT = httpx.ConnectError("connection refused")
OK, OK_STREAM = chat_reply(), stream_reply("hel", "lo")


@dataclass(frozen=True)
class Row:
    """What each endpoint answers (in turn) and what must follow."""

    upstreams: dict[str, Handler]
    status: int
    route: str | None
    reason: str
    outcome: str
    attempts: int
    code: str | None = None  # the error's code, for an error
    yaml: str = model_yaml()
    stream: bool = False


ROWS: dict[str, Callable[[], Row]] = {
    "dedicated serves": lambda: Row({"ded": answers(OK)}, 200, "ded", "baseline", "first_try", 1),
    "dedicated 503, serverless serves": lambda: Row(
        {"ded": answers(error_reply(503)), "sl1": answers(OK)}, 200, "sl1", "failover", "failed_over_ok", 2
    ),
    "dedicated refuses the connection": lambda: Row(
        {"ded": answers(CONNECT), "sl1": answers(OK)}, 200, "sl1", "failover", "failed_over_ok", 2
    ),
    "dedicated stalls past ttft_s": lambda: Row(
        {"ded": stall, "sl1": answers(OK)}, 200, "sl1", "failover", "failed_over_ok", 2
    ),
    "dedicated 401 (misconfigured) fails over": lambda: Row(
        {"ded": answers(error_reply(401)), "sl1": answers(OK)}, 200, "sl1", "failover", "failed_over_ok", 2
    ),
    "one serverless endpoint, 503 then served": lambda: Row(
        {"sl1": answers(error_reply(503), OK)},
        200,
        "sl1",
        "serverless_only",
        "retried_ok",
        2,
        yaml=model_yaml(dedicated=(), serverless=("sl1",)),
    ),
    "429 then served on the same endpoint": lambda: Row(
        {"sl1": answers(error_reply(429, headers={"retry-after": "0.01"}), OK)},
        200,
        "sl1",
        "serverless_only",
        "retried_ok",
        2,
        yaml=model_yaml(dedicated=(), serverless=("sl1",)),
    ),
    "every endpoint refuses the connection": lambda: Row(
        {n: answers(CONNECT) for n in ("ded", "sl1", "sl2")},
        502,
        "sl2",
        "failover",
        "exhausted",
        3,
        code="upstream_unreachable",
    ),
    "every endpoint stalls": lambda: Row(
        {n: stall for n in ("ded", "sl1", "sl2")},
        504,
        "sl2",
        "failover",
        "exhausted",
        3,
        code="upstream_timeout",
    ),
    "every endpoint is misconfigured": lambda: Row(
        {n: answers(error_reply(403)) for n in ("ded", "sl1", "sl2")},
        502,
        "sl2",
        "failover",
        "exhausted",
        3,
        code="upstream_misconfigured",
    ),
    "the upstream rejects the request (400)": lambda: Row(
        {"ded": answers(error_reply(400, "bad temperature"))}, 400, "ded", "baseline", "client_error", 1
    ),
    "attempts: 1 stops at the first failure": lambda: Row(
        {"ded": answers(error_reply(500))},
        500,
        "ded",
        "baseline",
        "exhausted",
        1,
        yaml=model_yaml(attempts=1),
    ),
    "a spent retry budget ends the walk": lambda: Row(
        {"sl1": answers(error_reply(503), OK)},
        503,
        "sl1",
        "serverless_only",
        "exhausted",
        1,
        yaml=model_yaml(dedicated=(), serverless=("sl1",), retry="budget_percent: 0, min_retries: 0"),
    ),
    "stream served": lambda: Row(
        {"ded": answers(OK_STREAM)}, 200, "ded", "baseline", "first_try", 1, stream=True
    ),
    "stream answered as JSON fails over": lambda: Row(
        {"ded": answers(chat_reply()), "sl1": answers(OK_STREAM)},
        200,
        "sl1",
        "failover",
        "failed_over_ok",
        2,
        stream=True,
    ),
    "stream cut after the first event": lambda: Row(
        {"ded": answers(cut_stream_reply("hel"))}, 200, "ded", "baseline", "failed_mid_stream", 1, stream=True
    ),
}


@pytest.mark.parametrize("case", sorted(ROWS))
async def test_the_walk(case):
    row = ROWS[case]()
    upstreams = MockUpstreams(row.upstreams)
    async with asgi_gateway(row.yaml, upstreams) as gw:
        reply = await gw.chat(stream=row.stream, user="u1")
        record = gw.outcomes.last
        left = gw.in_flight
    assert reply.status_code == row.status, reply.text
    assert (reply.headers.get("x-tidegate-route"), reply.headers["x-tidegate-reason"]) == (
        row.route,
        row.reason,
    )
    # a stream's headers leave before it can fail: they say how its attempts went so far
    told = "first_try" if row.outcome == "failed_mid_stream" else row.outcome
    assert reply.headers["x-tidegate-outcome"] == told
    assert reply.headers["x-tidegate-attempts"] == str(row.attempts)
    assert (record.route, record.reason, record.outcome, len(record.attempts)) == (
        row.route,
        row.reason,
        row.outcome,
        row.attempts,
    )
    assert len(upstreams.seen) == row.attempts
    assert record.retry_budget_denied == ("budget" in case)
    assert left == 0
    if row.code is not None:
        error = reply.json()["error"]
        assert error["code"] == row.code
        assert ".test" not in error["message"]  # no upstream address reaches the client
    if row.outcome == "failed_mid_stream":
        assert b"event: error" in reply.content and b"[DONE]" not in reply.content
        assert b'"code":"upstream_stream_cut"' in reply.content
        assert b"reset by peer" not in reply.content  # the transport's own words stay in the log
    elif row.stream:
        assert reply.content.endswith(b"data: [DONE]\n\n")


async def test_a_full_dedicated_pool_spills_as_saturated_and_a_dedicated_only_model_answers_503():
    upstreams = MockUpstreams({"ded": answers(OK), "sl1": answers(OK)})
    async with asgi_gateway(model_yaml(serverless=("sl1",), capacity=1), upstreams) as gw:
        held = await gw.app.state.store.leases.try_acquire("ded", Slots(1))
        spilled = await gw.chat()
        await gw.app.state.store.leases.release(held)
    assert (spilled.headers["x-tidegate-route"], spilled.headers["x-tidegate-reason"]) == ("sl1", "saturated")
    async with asgi_gateway(model_yaml(serverless=(), capacity=1), MockUpstreams({"ded": answers(OK)})) as gw:
        held = await gw.app.state.store.leases.try_acquire("ded", Slots(1))
        refused = await gw.chat()
        await gw.app.state.store.leases.release(held)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "no_capacity"


async def test_keys_outside_the_canary_go_to_serverless_as_canary_out():
    upstreams = MockUpstreams({"ded": answers(OK), "sl1": answers(OK), "sl2": answers(OK)})
    async with asgi_gateway(model_yaml(canary=0), upstreams) as gw:
        replies = [await gw.chat(user=f"user-{i}") for i in range(5)]
    assert {(r.headers["x-tidegate-route"], r.headers["x-tidegate-reason"]) for r in replies} == {
        ("sl1", "canary_out")
    }
    assert upstreams.calls("ded") == 0


async def test_an_open_circuit_is_skipped_as_circuit_open():
    upstreams = MockUpstreams({"ded": answers(OK), "sl1": answers(OK), "sl2": answers(OK)})
    async with asgi_gateway(model_yaml(), upstreams) as gw:
        await gw.app.state.store.circuits.trip("m/ded", cooldown_s=30, max_cooldown_s=60)
        reply = await gw.chat()
    assert (reply.headers["x-tidegate-route"], reply.headers["x-tidegate-reason"]) == ("sl1", "circuit_open")


async def test_cookies_an_upstream_sets_are_neither_kept_nor_sent_back_nor_relayed():
    """A shared cookie jar would be state any upstream could grow and would get back on
    every later request, from any client."""
    cookies = [f"c{i}=v{i}; Path=/" for i in range(50)]
    setting = httpx.Response(200, headers=[("set-cookie", c) for c in cookies], json=OK.json())
    upstreams = MockUpstreams({"sl1": answers(setting)})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        replies = [await gw.chat() for _ in range(3)]
    assert all(r.status_code == 200 and "set-cookie" not in r.headers for r in replies)
    assert len(upstreams.seen) == 3
    assert all("cookie" not in sent.headers for _, sent in upstreams.seen)


async def test_what_the_upstream_receives_and_what_the_client_is_told():
    upstreams = MockUpstreams({"sl1": answers(OK)})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        reply = await gw.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [], "user": "u"},
            headers={
                "x-tidegate-session": "s",
                "x-forwarded-for": "6.6.6.6",
                "openai-organization": "org-theirs",
                "connection": "x-secret",
                "x-secret": "1",
            },
        )
    ((_, sent),) = upstreams.seen
    assert sent.headers["authorization"] == "Bearer prov-sl1"  # the endpoint's key, never the client's
    assert sent.headers["x-forwarded-for"] == "10.0.0.7"  # ours, not the client's claim
    for dropped in ("x-tidegate-session", "openai-organization", "x-secret"):
        assert dropped not in sent.headers
    assert orjson.loads(sent.content)["model"] == "up"  # the endpoint's id for the model
    assert {k for k in reply.headers if k.startswith("x-tidegate-")} >= {
        "x-tidegate-route",
        "x-tidegate-kind",
        "x-tidegate-reason",
        "x-tidegate-outcome",
        "x-tidegate-attempts",
    }
    assert reply.headers["x-tidegate-kind"] == "serverless"


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"authorization": "Bearer nope"}, {"model": "m", "messages": []}, 401, "invalid_api_key"),
        ({}, {"model": "nope", "messages": []}, 404, "model_not_found"),
        ({}, {"model": "m", "messages": [], "stream": "yes"}, 400, None),
        ({}, {"model": "m", "messages": [], "n": 5000}, 400, None),
    ],
)
async def test_the_gateways_own_refusals_reach_no_upstream(headers, body, status, code):
    upstreams = MockUpstreams({"ded": answers(OK), "sl1": answers(OK), "sl2": answers(OK)})
    async with asgi_gateway(model_yaml(), upstreams) as gw:
        reply = await gw.client.post("/v1/chat/completions", json=body, headers=headers)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert code is None or error["code"] == code
    assert upstreams.seen == []


async def test_every_outcome_is_recorded_once_with_its_attempts():
    upstreams = MockUpstreams({"ded": answers(error_reply(503), OK), "sl1": answers(OK), "sl2": answers(OK)})
    async with asgi_gateway(model_yaml(), upstreams) as gw:
        await gw.chat()
        await gw.chat()
        counts = dict(gw.app.state.recorder.outcomes)
        records = gw.outcomes.records
    assert counts == {"failed_over_ok": 1, "first_try": 1}
    first, second = records
    assert [a.endpoint for a in first.attempts] == ["ded", "sl1"] and first.attempts[0].error is not None
    assert [a.endpoint for a in second.attempts] == ["ded"] and second.attempts[0].error is None


async def test_the_lean_path_keeps_headers_metrics_and_the_access_line(caplog):
    """The proxied paths bypass FastAPI's middleware: nothing they owe the operator is lost."""
    import logging  # noqa: PLC0415

    from router.record.records import ACCESS_LOG  # noqa: PLC0415

    upstreams = MockUpstreams({"ded": answers(OK)})
    async with asgi_gateway(model_yaml(), upstreams) as gw:
        with caplog.at_level(logging.INFO, logger=ACCESS_LOG):
            reply = await gw.chat(user="u")
        metrics = (await gw.client.get("/metrics")).text
        wrong_method = await gw.client.get("/v1/chat/completions")
    assert {k for k in reply.headers if k.startswith("x-tidegate-")} >= {
        "x-tidegate-route",
        "x-tidegate-kind",
        "x-tidegate-reason",
        "x-tidegate-outcome",
        "x-tidegate-attempts",
        "x-tidegate-overhead-ms",
        "x-tidegate-upstream-model",
    }
    assert (
        'tidegate_requests_total{kind="dedicated",model="m",outcome="first_try",route="ded"} 1.0' in metrics
    )
    (line,) = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOG]
    assert orjson.loads(line)["outcome"] == "first_try"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
