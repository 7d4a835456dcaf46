"""What an OpenAI client sees of the gateway besides routing, in-process: the models routes,
the retry contract with the SDKs (`x-should-retry`, `Retry-After`) and the answer's `model`."""

from __future__ import annotations

import orjson
import pytest

from router.openai import model_renamer
from tests.router.asgi import (
    MockUpstreams,
    answers,
    asgi_gateway,
    chat_reply,
    error_reply,
    model_yaml,
    stream_reply,
)

OK = chat_reply()


async def test_models_are_listed_and_retrieved_behind_the_client_keys():
    async with asgi_gateway(model_yaml(), MockUpstreams({})) as gw:
        listed = await gw.client.get("/v1/models")
        one = await gw.client.get("/v1/models/m")
        missing = await gw.client.get("/v1/models/nope")
        anonymous = await gw.client.get("/v1/models", headers={"authorization": ""})
        wrong = await gw.client.get("/v1/models/m", headers={"authorization": "Bearer nope"})
    assert [m["id"] for m in listed.json()["data"]] == ["m"]
    assert one.status_code == 200 and one.json()["id"] == "m" and one.json()["object"] == "model"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert anonymous.status_code == 401 and wrong.status_code == 401


async def test_a_model_name_with_a_slash_is_retrieved():
    yaml = model_yaml().replace("\n  m:\n", "\n  org/m-1:\n")
    async with asgi_gateway(yaml, MockUpstreams({})) as gw:
        one = await gw.client.get("/v1/models/org/m-1")
    assert one.status_code == 200 and one.json()["id"] == "org/m-1"


@pytest.mark.parametrize(
    ("yaml", "upstreams", "should_retry", "retry_after"),
    [
        # the gateway retried: the SDK must not retry on top, nor wait a Retry-After again
        (model_yaml(), {n: answers(error_reply(503)) for n in ("ded", "sl1", "sl2")}, "false", None),
        (
            model_yaml(dedicated=(), serverless=("sl1",), attempts=2),
            {"sl1": answers(error_reply(429, headers={"retry-after": "0.01"}))},
            "false",
            None,
        ),
        # the retry budget said no: same
        (
            model_yaml(dedicated=(), serverless=("sl1",), retry="budget_percent: 0, min_retries: 0"),
            {"sl1": answers(error_reply(503))},
            "false",
            None,
        ),
        # one attempt allowed: the gateway did not retry, the client may, after Retry-After
        (
            model_yaml(dedicated=(), serverless=("sl1",), attempts=1),
            {"sl1": answers(error_reply(429, headers={"retry-after": "2"}))},
            None,
            "2",
        ),
    ],
)
async def test_an_sdk_is_told_whether_to_retry(yaml, upstreams, should_retry, retry_after):
    async with asgi_gateway(yaml, MockUpstreams(upstreams)) as gw:
        reply = await gw.chat()
    assert reply.status_code >= 429
    assert reply.headers.get("x-should-retry") == should_retry
    assert reply.headers.get("retry-after") == retry_after


@pytest.mark.parametrize("stream", [False, True])
async def test_the_answer_names_the_requested_model_and_the_header_the_upstreams(stream):
    reply_up = stream_reply("a", "b") if stream else OK
    async with asgi_gateway(model_yaml(), MockUpstreams({"ded": answers(reply_up)})) as gw:
        reply = await gw.chat(stream=stream)
    assert reply.headers["x-tidegate-upstream-model"] == "up"
    if stream:
        events = [
            orjson.loads(line[6:]) for line in reply.content.split(b"\n") if line.startswith(b"data: {")
        ]
        assert events and {e["model"] for e in events} == {"m"}
    else:
        assert reply.json()["model"] == "m"


async def test_response_model_upstream_keeps_the_upstreams_id():
    yaml = model_yaml().replace("    canary_percent:", "    response_model: upstream\n    canary_percent:")
    async with asgi_gateway(yaml, MockUpstreams({"ded": answers(OK)})) as gw:
        reply = await gw.chat()
    assert reply.json()["model"] == "up" and reply.headers["x-tidegate-upstream-model"] == "up"


@pytest.mark.parametrize(
    ("data", "renamed"),
    [
        (b'{"id":"x","model":"up/7b","choices":[]}', b'{"id":"x","model":"m","choices":[]}'),
        (b'{"id": "x", "model": "up/7b"}', b'{"id": "x", "model": "m"}'),
        (
            b'data: {"model":"up/7b"}\n\ndata: {"model":"up/7b"}\n\n',
            b'data: {"model":"m"}\n\ndata: {"model":"m"}\n\n',
        ),
        (b'{"model":"up/7b-chat"}', b'{"model":"up/7b-chat"}'),  # another id that starts the same
        (
            b'{"content":"the \\"model\\":\\"up/7b\\" text"}',
            b'{"content":"the \\"model\\":\\"up/7b\\" text"}',
        ),
    ],
)
def test_the_model_rename_touches_only_the_model_field(data, renamed):
    rename = model_renamer("up/7b", "m")
    assert rename is not None and rename(data) == renamed
    assert model_renamer("same", "same") is None
