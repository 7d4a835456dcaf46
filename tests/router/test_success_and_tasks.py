"""Success, tasks and feedback (issue 14) through the whole app: every answer names its
request, the automatic checks judge served answers (bodies and streams alike), tasks group
requests and move to the route of their last request, and feedback marks them failed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from policies.types import route_key
from router.record.tasks import settle_deltas
from router.state.tasks import TaskState
from tests.router.asgi import (
    Gateway,
    MockUpstreams,
    _event,
    answers,
    asgi_gateway,
    chat_reply,
    cut_stream_reply,
    error_reply,
    model_yaml,
)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
JSON_OBJECT = {"response_format": {"type": "json_object"}}
JSON_SCHEMA = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
TOOLS = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}


def message_reply(content: str | None, finish: str = "stop", tool_args: str | None = None) -> httpx.Response:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_args is not None:
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": tool_args}}
        ]
    body = {
        "id": "c1",
        "object": "chat.completion",
        "model": "up",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
    }
    return httpx.Response(200, json=body)


class EventByEvent(httpx.AsyncByteStream):
    """One upstream chunk per event, as a real engine sends them."""

    def __init__(self, events: list[bytes]) -> None:
        self._events = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self._events:
            yield event


def streamed(content: str | None, finish: str = "stop", tool_args: str | None = None) -> httpx.Response:
    """The same answer as a stream, its text and arguments split over several events."""
    events = []
    if content:
        for i in range(0, len(content), 3):
            delta = {"content": content[i : i + 3]}
            events.append({"index": 0, "delta": delta, "finish_reason": None})
    if tool_args is not None:
        for i in range(0, len(tool_args), 4):
            call = {"index": 0, "function": {"arguments": tool_args[i : i + 4]}}
            if i == 0:
                call |= {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": tool_args[:4]},
                }
            events.append({"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None})
    events.append({"index": 0, "delta": {}, "finish_reason": finish})
    frames = [
        _event({"id": "c1", "object": "chat.completion.chunk", "model": "up", "choices": [c]}) for c in events
    ]
    frames.append(b"data: [DONE]\n\n")
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=EventByEvent(frames))


CASES = [
    ("ok", message_reply("hi"), {}, None),
    ("length", message_reply("hi", finish="length"), {}, "finish_length"),
    ("length under max_tokens", message_reply("hi", finish="length"), {"max_tokens": 2}, None),
    (
        "length under max_completion_tokens",
        message_reply("hi", finish="length"),
        {"max_completion_tokens": 2},
        None,
    ),
    (
        "length cut json",
        message_reply('{"a": ', finish="length"),
        {**JSON_OBJECT, "max_tokens": 2},
        "json_invalid",
    ),
    ("json ok", message_reply('{"a": 1}'), JSON_OBJECT, None),
    ("json broken", message_reply('{"a": '), JSON_OBJECT, "json_invalid"),
    ("schema ok", message_reply('{"n": 3}'), JSON_SCHEMA, None),
    ("schema mismatch", message_reply('{"n": "three"}'), JSON_SCHEMA, "json_schema_mismatch"),
    ("tool args ok", message_reply(None, "tool_calls", '{"city": "Oslo"}'), TOOLS, None),
    ("tool args broken", message_reply(None, "tool_calls", '{"city": "Os'), TOOLS, "tool_args_invalid"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(("name", "reply", "extra", "failed_check"), CASES, ids=[c[0] for c in CASES])
async def test_automatic_checks_judge_served_answers(name, reply, extra, failed_check, stream):
    if stream:
        body = orjson.loads(reply.content)
        choice = body["choices"][0]
        calls = choice["message"].get("tool_calls")
        reply = streamed(
            choice["message"]["content"],
            choice["finish_reason"],
            calls[0]["function"]["arguments"] if calls else None,
        )
    upstreams = MockUpstreams({"sl1": answers((lambda: reply) if stream else reply)})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        answer = await gw.chat(stream=stream, **extra)
        await gw.app.state.ledger.drained()
        counts = (await gw.app.state.store.series.counts_window([route_key("m", "sl1")], 60))[route_key("m", "sl1")]
    assert answer.status_code == 200
    record = gw.outcomes.last
    assert record.measures.failed_check == failed_check
    assert record.success is (failed_check is None)
    assert counts.get("tasks") == 1
    assert counts.get("tasks_ok", 0) == (1 if failed_check is None else 0)
    if failed_check is not None:
        assert counts.get(f"fail:{failed_check}") == 1


@pytest.mark.parametrize(("setting", "failed_check"), [("success", None), ("failure", "finish_length")])
async def test_a_model_decides_whether_its_callers_max_tokens_cut_is_a_success(setting, failed_check):
    text = model_yaml(dedicated=(), serverless=("sl1",))
    text = text.replace(
        "    canary_percent:", f"    success: {{length_under_max_tokens: {setting}}}\n    canary_percent:"
    )
    upstreams = MockUpstreams({"sl1": answers(message_reply("hi", finish="length"))})
    async with asgi_gateway(text, upstreams) as gw:
        answer = await gw.chat(max_tokens=2)
        await gw.app.state.ledger.drained()
    assert answer.status_code == 200
    assert gw.outcomes.last.measures.failed_check == failed_check


async def test_every_answer_names_its_request_served_or_not():
    upstreams = MockUpstreams({"sl1": answers(chat_reply(), error_reply(400))})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        served, refused = await gw.chat(), await gw.chat()
    ids = [served.headers["x-tidegate-request-id"], refused.headers["x-tidegate-request-id"]]
    assert refused.status_code == 400
    assert all(i.startswith("req_") and len(i) == 28 for i in ids) and ids[0] != ids[1]
    assert [r.request_id for r in gw.outcomes.records] == ids


@pytest.mark.parametrize("task_id", ["", "a b", "x" * 129, "é", "a/b"])
async def test_a_malformed_task_id_is_refused_before_any_upstream(task_id):
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        reply = await gw.client.post(
            "/v1/chat/completions", json=body, headers={"x-tidegate-task-id": task_id.encode("utf-8")}
        )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "x-tidegate-task-id"
    assert upstreams.seen == []


async def _counts(gw, *endpoints: str) -> dict[str, dict[str, float]]:
    await gw.app.state.ledger.drained()
    routes = [route_key("m", e) for e in endpoints]
    found = await gw.app.state.store.series.counts_window(routes, 60)
    return {e: found[route_key("m", e)] for e in endpoints}


async def test_a_task_counts_once_on_the_route_of_its_last_request():
    upstreams = MockUpstreams(
        {"ded": answers(chat_reply()), "sl1": answers(chat_reply()), "sl2": answers(chat_reply())}
    )
    async with asgi_gateway(model_yaml(capacity=1), upstreams) as gw:
        for _ in range(3):  # one agent's three steps: dedicated has room each time
            reply = await gw.client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-tidegate-task-id": "agent-7"},
            )
            assert reply.status_code == 200
        await gw.chat()  # a task of its own
        counts = await _counts(gw, "ded", "sl1")
    assert counts["ded"]["tasks"] == 2  # agent-7 and the lone request
    assert counts["ded"]["tasks_ok"] == 2
    assert counts["ded"]["requests"] == 4


async def test_a_task_moves_to_the_route_that_served_its_last_request():
    upstreams = MockUpstreams(
        {
            "ded": answers(chat_reply(), error_reply(503)),
            "sl1": answers(chat_reply()),
            "sl2": answers(chat_reply()),
        }
    )
    async with asgi_gateway(model_yaml(capacity=1, attempts=2), upstreams) as gw:
        for _ in range(2):  # first on ded; the second fails there and fails over to sl1
            await gw.client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-tidegate-task-id": "t1"},
            )
        counts = await _counts(gw, "ded", "sl1")
    assert counts["ded"].get("tasks", 0) == 0 and counts["ded"].get("tasks_ok", 0) == 0
    assert counts["sl1"]["tasks"] == 1 and counts["sl1"]["tasks_ok"] == 1
    assert counts["ded"]["wasted_busy_ms"] > 0 and counts["ded"]["failed_attempts"] == 1


async def a_request_and_a_task(gw: Gateway) -> httpx.Response:
    """One request on its own and one of task `job-1`, both settled; the lone one's answer."""
    lone = await gw.chat()
    await gw.client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-tidegate-task-id": "job-1"},
    )
    await gw.app.state.ledger.drained()
    return lone


async def test_feedback_marks_a_request_and_a_task_failed_once():
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        lone = await a_request_and_a_task(gw)
        by_request = await gw.client.post(
            "/v1/feedback",
            json={"request_id": lone.headers["x-tidegate-request-id"], "success": False, "reason": "bad"},
        )
        by_task = await gw.client.post("/v1/feedback", json={"task_id": "job-1", "success": False})
        again = await gw.client.post("/v1/feedback", json={"task_id": "job-1", "success": False})
        counts = await _counts(gw, "sl1")
    assert by_request.status_code == 200 and by_request.json()["applied"] is True
    assert by_task.json() == {
        "object": "feedback",
        "task_id": "job-1",
        "request_id": None,
        "success": False,
        "applied": True,
    }
    assert again.status_code == 200
    assert counts["sl1"]["tasks"] == 2
    assert counts["sl1"].get("tasks_ok", 0) == 0
    assert counts["sl1"]["feedback_failed"] == 2  # the repeat moved nothing


async def test_feedback_before_the_request_settled_still_counts():
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        early = await gw.client.post("/v1/feedback", json={"task_id": "later", "success": False})
        await gw.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-tidegate-task-id": "later"},
        )
        counts = await _counts(gw, "sl1")
    assert early.json()["applied"] is False
    assert counts["sl1"]["tasks"] == 1 and counts["sl1"].get("tasks_ok", 0) == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json", None),
        (b"[]", None),
        (orjson.dumps({"success": False}), "request_id"),
        (orjson.dumps({"request_id": "req_" + "0" * 24, "task_id": "t", "success": False}), "request_id"),
        (orjson.dumps({"request_id": "nope", "success": False}), "request_id"),
        (orjson.dumps({"task_id": "a b", "success": False}), "task_id"),
        (orjson.dumps({"task_id": "t", "success": "no"}), "success"),
        (orjson.dumps({"task_id": "t", "success": False, "reason": "x" * 257}), "reason"),
        (orjson.dumps({"task_id": "t", "success": False, "extra": 1}), "extra"),
    ],
)
async def test_malformed_feedback_is_a_400(body, param):
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        reply = await gw.client.post(
            "/v1/feedback", content=body, headers={"content-type": "application/json"}
        )
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert reply.json()["error"]["param"] == param


async def test_feedback_needs_a_client_key_and_a_small_body():
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    async with asgi_gateway(model_yaml(dedicated=(), serverless=("sl1",)), upstreams) as gw:
        anonymous = await gw.client.post(
            "/v1/feedback", json={"task_id": "t", "success": False}, headers={"authorization": ""}
        )
        huge = await gw.client.post(
            "/v1/feedback", json={"task_id": "t", "success": False, "reason": "x" * 20_000}
        )
    assert anonymous.status_code == 401
    assert huge.status_code == 413


TWO_KEYS = "auth: {api_keys: [key, key2], admin_key: adm}"


def two_keys_yaml() -> str:
    return model_yaml(dedicated=(), serverless=("sl1",)).replace("auth: {api_keys: [key]}", TWO_KEYS)


async def test_only_the_key_that_made_a_request_or_task_can_judge_it():
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    other = {"authorization": "Bearer key2"}
    async with asgi_gateway(two_keys_yaml(), upstreams) as gw:
        lone = await a_request_and_a_task(gw)
        request_id = lone.headers["x-tidegate-request-id"]
        stolen = await gw.client.post(
            "/v1/feedback", json={"request_id": request_id, "success": False}, headers=other
        )
        # key2's "job-1" is another task than key's: nothing of key's moves
        namesake = await gw.client.post(
            "/v1/feedback", json={"task_id": "job-1", "success": False}, headers=other
        )
        counts_before = await _counts(gw, "sl1")
        owner = await gw.client.post("/v1/feedback", json={"request_id": request_id, "success": False})
        caller = gw.outcomes.records[-1].caller
        admin = await gw.client.post(
            "/v1/feedback",
            json={"task_id": "job-1", "success": False, "key_id": caller},
            headers={"authorization": "Bearer adm"},
        )
        counts = await _counts(gw, "sl1")
    assert stolen.status_code == 403 and stolen.json()["error"]["code"] == "permission_denied"
    assert namesake.status_code == 200 and namesake.json()["applied"] is False
    assert counts_before["sl1"]["tasks_ok"] == 2  # neither moved anything
    assert owner.json()["applied"] is True and admin.json()["applied"] is True
    assert caller is not None and caller.startswith("key-") and "key" not in caller[4:]
    assert counts["sl1"].get("tasks_ok", 0) == 0 and counts["sl1"]["feedback_failed"] == 2


async def test_early_feedback_is_bounded_per_key_and_answers_429_past_it():
    yaml_text = two_keys_yaml().replace("models:", "tasks: {max_early_feedback: 3}\nmodels:")
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    async with asgi_gateway(yaml_text, upstreams) as gw:
        kept = [
            await gw.client.post("/v1/feedback", json={"task_id": f"unknown-{i}", "success": False})
            for i in range(4)
        ]
        other = await gw.client.post(
            "/v1/feedback",
            json={"task_id": "unknown-0", "success": False},
            headers={"authorization": "Bearer key2"},
        )
    assert [r.status_code for r in kept] == [200, 200, 200, 429]
    assert kept[-1].json()["error"]["code"] == "rate_limit_exceeded" and kept[-1].headers["retry-after"]
    assert other.status_code == 200  # another key's bound is its own


def test_request_ids_do_not_follow_the_random_module():
    """Ids from `random` can be predicted from a few observed ones; from `secrets` they cannot.
    Reseeding `random` must not repeat an id."""
    import random  # noqa: PLC0415

    async def one_id() -> str:
        upstreams = MockUpstreams({"sl1": answers(chat_reply())})
        async with asgi_gateway(two_keys_yaml(), upstreams) as gw:
            random.seed(7)
            return (await gw.chat()).headers["x-tidegate-request-id"]

    import asyncio  # noqa: PLC0415

    assert asyncio.run(one_id()) != asyncio.run(one_id())


async def test_a_feedback_reason_reaches_the_log_json_encoded(caplog):
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    forged = 'bad\n{"model": "m", "status": 200, "forged": true}'
    async with asgi_gateway(two_keys_yaml(), upstreams) as gw:
        with caplog.at_level("INFO", logger="tidegate"):
            await gw.client.post("/v1/feedback", json={"task_id": "t1", "success": False, "reason": forged})
    lines = [r.getMessage() for r in caplog.records if "feedback" in r.getMessage()]
    assert lines and all("\n" not in line for line in lines)
    assert orjson.loads(lines[0].removeprefix("feedback: "))["reason"] == forged


async def test_a_task_id_with_a_trailing_newline_is_a_400():
    upstreams = MockUpstreams({"sl1": answers(chat_reply())})
    async with asgi_gateway(two_keys_yaml(), upstreams) as gw:
        reply = await gw.client.post("/v1/feedback", json={"task_id": "job\n", "success": False})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "task_id"


async def test_a_cut_stream_is_wasted_spend_on_its_route():
    yaml_text = model_yaml(dedicated=(), serverless=("sl1",)).replace(
        "api_key: 'prov-sl1'", "api_key: 'prov-sl1', usd_per_mtok_in: 1000000, usd_per_mtok_out: 1000000"
    )
    upstreams = MockUpstreams({"sl1": answers(cut_stream_reply("a", "b", "c"))})
    async with asgi_gateway(yaml_text, upstreams) as gw:
        reply = await gw.chat(stream=True)
        assert b"event: error" in reply.content
        counts = await _counts(gw, "sl1")
    # no usage came: 3 output events counted (estimated) at $1 per token, all of it wasted
    assert counts["sl1"]["cost_usd"] == counts["sl1"]["wasted_usd"] == 3.0
    assert counts["sl1"]["tokens_estimated"] == 1
    assert counts["sl1"].get("tasks_ok", 0) == 0


def test_a_superseded_settle_moves_only_a_new_failure_on_the_route_the_task_stays_on():
    """The ledger applies a superseded settle as the task's own route and outcome (router/record/tasks.py)."""
    kept = TaskState("m/b", ok=True, failed=False, owner="k", superseded=True)
    assert settle_deltas(kept, kept.route, kept.ok) == {}  # nothing moves
    marked = TaskState("m/b", ok=True, failed=True, owner="k", superseded=True)
    assert settle_deltas(marked, marked.route, marked.ok) == {"m/b": {"tasks_ok": -1}}
