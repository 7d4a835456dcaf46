"""What the simulator answers, as vLLM would: lengths and finish reasons, stop sequences,
seeds, structured outputs, tool calls, and the requests it refuses (tidegate/sim/answers.py,
tidegate/sim/validation.py)."""

from __future__ import annotations

import random

import httpx
import orjson
import pytest
from jsonschema import Draft202012Validator

from tidegate.sim.answers import instance_of, plan
from tidegate.sim.app import create_sim_app
from tidegate.sim.profile import SimProfile

FIXED = SimProfile(time_scale=1000.0)  # answers run to max_tokens
SAMPLED = SimProfile(time_scale=1000.0, answer_tokens_p50=30)
MSG = [{"role": "user", "content": "hi"}]


def finish(payload: dict, profile: SimProfile = FIXED) -> tuple[str, int]:
    (choice,) = plan(payload, profile, random.Random(1))
    return choice.finish_reason, len(choice.pieces)


@pytest.mark.parametrize(
    ("payload", "profile", "expected"),
    [
        ({"messages": MSG, "max_tokens": 5}, FIXED, ("length", 5)),
        ({"messages": MSG}, FIXED, ("stop", 16)),  # no max_tokens: the default length, and it stops
        ({"messages": MSG, "max_tokens": 9, "stop": "routes"}, FIXED, ("stop", 3)),  # "the tide gate" + stop
        ({"messages": MSG, "max_tokens": 9, "stop": ["zzz", "gate"]}, FIXED, ("stop", 2)),
        ({"messages": MSG, "max_tokens": 2, "stop": "routes"}, FIXED, ("length", 2)),  # cut before the stop
        ({"messages": MSG, "max_tokens": 1000}, SAMPLED, None),  # sampled: shorter than 1000, stops
        ({"messages": MSG, "max_tokens": 1000, "ignore_eos": True}, SAMPLED, ("length", 1000)),
    ],
)
def test_lengths_and_finish_reasons(payload, profile, expected):
    reason, tokens = finish(payload, profile)
    if expected is None:
        assert reason == "stop" and 1 <= tokens < 1000
    else:
        assert (reason, tokens) == expected


def test_sampled_lengths_spread_and_a_seed_repeats_an_answer():
    lengths = {finish({"messages": MSG, "max_tokens": 10_000, "seed": s}, SAMPLED)[1] for s in range(40)}
    assert len(lengths) > 10
    assert finish({"messages": MSG, "seed": 7}, SAMPLED) == finish({"messages": MSG, "seed": 7}, SAMPLED)


def test_n_choices():
    assert len(plan({"messages": MSG, "n": 3, "max_tokens": 2}, FIXED, random.Random(1))) == 3


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 10},
        "when": {"type": "string", "format": "date-time"},
        "size": {"type": "integer", "minimum": 3},
        "kind": {"enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 2},
        "maybe": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "nested": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    },
    "required": ["name", "when", "size", "kind", "tags", "maybe", "nested"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}},
}


def test_a_json_schema_answer_is_an_instance_of_its_schema():
    value = instance_of(SCHEMA, random.Random(1), SCHEMA)
    assert not list(Draft202012Validator(SCHEMA).iter_errors(value))
    payload = {
        "messages": MSG,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    }
    (choice,) = plan(payload, FIXED, random.Random(1))
    assert choice.finish_reason == "stop"
    assert not list(Draft202012Validator(SCHEMA).iter_errors(orjson.loads(choice.text)))
    (obj,) = plan({"messages": MSG, "response_format": {"type": "json_object"}}, FIXED, random.Random(1))
    assert isinstance(orjson.loads(obj.text), dict)


# instructor's JSON modes put the model's schema in the system message, as text
INSTRUCTOR_SYSTEM = (
    "As a genius expert, your task is to understand the content and provide the parsed objects in json "
    "that match the following json_schema:\n\n"
    + orjson.dumps(SCHEMA).decode()
    + "\n\nMake sure to return an instance of the JSON, not the schema itself"
)
ASKS_FOR_SCHEMA = [{"role": "system", "content": INSTRUCTOR_SYSTEM}, *MSG]


def test_json_mode_answers_the_schema_the_prompt_carries():
    payload = {"messages": ASKS_FOR_SCHEMA, "response_format": {"type": "json_object"}}
    (choice,) = plan(payload, FIXED, random.Random(1))
    assert not list(Draft202012Validator(SCHEMA).iter_errors(orjson.loads(choice.text)))


def test_a_prompt_with_a_schema_and_no_response_format_gets_a_fenced_json_instance():
    (choice,) = plan({"messages": ASKS_FOR_SCHEMA}, FIXED, random.Random(1))
    assert choice.text.startswith("```json\n") and choice.text.endswith("\n```")
    inner = choice.text.removeprefix("```json\n").removesuffix("\n```")
    assert not list(Draft202012Validator(SCHEMA).iter_errors(orjson.loads(inner)))


@pytest.mark.parametrize(
    "prompt",
    ["hi", "a brace { and a list [1, 2] and {\"not\": \"a schema\"}", "{" * 5000],
)
def test_json_mode_without_a_schema_in_the_prompt_answers_a_plain_object(prompt):
    payload = {"messages": [{"role": "user", "content": prompt}], "response_format": {"type": "json_object"}}
    (choice,) = plan(payload, FIXED, random.Random(1))
    assert orjson.loads(choice.text) == {"answer": "the tide gate routes every token"}


TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


@pytest.mark.parametrize(
    ("extra", "calls"),
    [
        ({"tool_choice": "required"}, True),
        ({"tool_choice": {"type": "function", "function": {"name": "lookup"}}}, True),
        ({"tool_choice": "none"}, False),
        ({}, True),  # auto, with the default tool_call_share of 1
        ({"messages": [*MSG, {"role": "tool", "tool_call_id": "c", "content": "42"}]}, False),  # answered
    ],
)
def test_tool_calls(extra, calls):
    (choice,) = plan({"messages": MSG, "tools": [TOOL], **extra}, FIXED, random.Random(1))
    assert bool(choice.tool_calls) is calls
    if calls:
        assert choice.finish_reason == "tool_calls" and choice.tool_calls[0].name == "lookup"
        assert isinstance(orjson.loads(choice.tool_calls[0].arguments)["q"], str)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {"model": "m"}, 400),  # no messages
        ("/v1/chat/completions", {"model": "m", "messages": MSG, "temperature": "hot"}, 400),
        ("/v1/chat/completions", {"model": "m", "messages": "hi"}, 400),
        ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": "5"}, 400),
        ("/v1/embeddings", {"model": "m"}, 400),
        ("/v1/chat/completions", {"model": "other", "messages": MSG}, 404),  # not a served model
        ("/v1/chat/completions", {"model": "m", "messages": MSG}, 200),
    ],
)
async def test_requests_vllm_refuses(path, body, status):
    app = create_sim_app(SimProfile(time_scale=1000.0, served_models=("m",)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        reply = await client.post(path, json=body)
    assert reply.status_code == status, reply.text
    if status != 200:
        assert reply.json()["error"]["message"]
    else:
        assert reply.json()["choices"][0]["message"]["refusal"] is None
