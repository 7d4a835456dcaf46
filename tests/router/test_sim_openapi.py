"""Every answer the simulator gives, and the gateway relays, is valid against the OpenAI API
spec (tests/data/openai_schemas.json, extracted from OpenAI's published openapi.yaml by
scripts/openai_schemas.py): chat, completions, embeddings, responses and models, stream and
non-stream, with n, logprobs, tools, response_format and stop. In-process: the simulator's
app behind httpx.ASGITransport, and the gateway in front of it the same way."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from jsonschema import Draft202012Validator

from router.app import create_app
from router.config import Endpoint, parse_config
from tidegate.sim.app import create_sim_app
from tidegate.sim.profile import Kind, SimProfile

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "openai_schemas.json"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "tags"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "hi"}]

# (path, request body, schema of the answer, schema of each stream event)
CASES: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "chat": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 5},
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
    ),
    "chat n=2 with logprobs": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 4, "n": 2, "logprobs": True, "top_logprobs": 2},
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
    ),
    "chat stop sequence": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 9, "stop": ["routes"]},
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
    ),
    "chat tools": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required"},
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
    ),
    "chat json_schema": (
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
            },
        },
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
    ),
    "completions": (
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 5, "logprobs": 1},
        "CreateCompletionResponse",
        "CreateCompletionResponse",
    ),
    "responses": (
        "/v1/responses",
        {"input": "hi", "max_output_tokens": 6},
        "Response",
        "ResponseStreamEvent",
    ),
    "responses tools": (
        "/v1/responses",
        {
            "input": "hi",
            "tools": [
                {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
            ],
            "tool_choice": "required",
        },
        "Response",
        "ResponseStreamEvent",
    ),
}


@cache
def validator(name: str) -> Draft202012Validator:
    spec = orjson.loads(SCHEMAS.read_bytes())
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": spec["components"]})


def assert_valid(name: str, value: Any) -> None:
    errors = sorted(validator(name).iter_errors(value), key=lambda e: list(e.path))
    assert not errors, f"{name}: " + "; ".join(f"{list(e.path)}: {e.message[:200]}" for e in errors[:5])


def events(body: bytes) -> list[Any]:
    out = []
    for block in body.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                out.append(orjson.loads(line[6:]))
    return out


SIM = SimProfile(kind=Kind.SERVERLESS, name="sim", time_scale=1000.0, seed=3)


@contextlib.asynccontextmanager
async def direct() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_sim_app(SIM)), base_url="http://sim"
    ) as c:
        yield c


@contextlib.asynccontextmanager
async def through_gateway() -> AsyncIterator[httpx.AsyncClient]:
    sim = create_sim_app(SIM)

    def transport(endpoint: Endpoint) -> httpx.AsyncBaseTransport:
        return httpx.ASGITransport(app=sim)

    yaml = "auth: {allow_anonymous: true}\nmodels:\n  m:\n    serverless: [{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://sim/v1', model: up}]\n"
    app = create_app(parse_config(yaml, {}), transport=transport)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    async with app.router.lifespan_context(app), client:
        yield client


VIA = {"simulator": direct, "gateway": through_gateway}


@pytest.mark.parametrize("via", sorted(VIA))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
async def test_answers_follow_the_openai_spec(case, stream, via):
    path, body, answer_schema, event_schema = CASES[case]
    async with VIA[via]() as client:
        reply = await client.post(path, json={"model": "m", **body, "stream": stream})
    assert reply.status_code == 200, reply.text
    if not stream:
        assert_valid(answer_schema, reply.json())
        return
    seen = events(reply.content)
    assert seen
    for event in seen:
        assert_valid(event_schema, event)


@pytest.mark.parametrize("via", sorted(VIA))
@pytest.mark.parametrize("encoding", ["float", "base64"])
async def test_embeddings_follow_the_spec_in_both_encodings(via, encoding):
    async with VIA[via]() as client:
        reply = await client.post(
            "/v1/embeddings",
            json={"model": "m", "input": ["a", "b"], "encoding_format": encoding, "dimensions": 16},
        )
    assert reply.status_code == 200, reply.text
    assert_valid("CreateEmbeddingResponse", reply.json())
    first = reply.json()["data"][0]["embedding"]
    assert (isinstance(first, str)) is (encoding == "base64")


async def test_models_follow_the_spec():
    async with direct() as client:
        assert_valid("ListModelsResponse", (await client.get("/v1/models")).json())
    async with through_gateway() as client:
        assert_valid("ListModelsResponse", (await client.get("/v1/models")).json())
        assert_valid("Model", (await client.get("/v1/models/m")).json())
