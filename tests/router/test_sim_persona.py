"""The simulator's personas (tidegate/sim/persona.py): what each one changes, on what share,
and that the choice is a function of the seed and the request alone."""

from __future__ import annotations

import random

import orjson
import pytest

from tidegate.sim import answers, persona
from tidegate.sim.profile import Persona, SimProfile

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"type": "string"}, "city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
        },
    },
]
SCHEMA = {
    "type": "object",
    "properties": {"note": {"type": "string"}, "total": {"type": "number"}},
    "required": ["total"],
}


def tool_request(i, tools=TOOLS):
    return {
        "messages": [{"role": "user", "content": f"q{i}"}],
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }


def json_request(i):
    return {
        "messages": [{"role": "user", "content": f"q{i}"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    }


def answered(kind, share, request, seed=3):
    choices = answers.plan(request, SimProfile(), random.Random(0))
    return choices, persona.apply(kind, share, seed, request, choices)


def test_faithful_and_share_zero_change_nothing():
    for i in range(20):
        for kind in Persona:
            plain, drifted = answered(kind, 0.0 if kind is not Persona.FAITHFUL else 1.0, tool_request(i))
            assert drifted == plain


def test_tool_drift_calls_another_tool_or_drops_a_required_argument():
    flips = drops = 0
    for i in range(200):
        plain, drifted = answered(Persona.TOOL_DRIFT, 1.0, tool_request(i))
        call, before = drifted[0].tool_calls[0], plain[0].tool_calls[0]
        if call.name != before.name:
            flips += 1
            assert call.name == "get_time"
        else:
            drops += 1
            assert "city" not in orjson.loads(call.arguments) and "city" in orjson.loads(before.arguments)
    assert flips > 50 and drops > 50
    _, single = answered(Persona.TOOL_DRIFT, 1.0, tool_request(0, TOOLS[:1]))
    assert single[0].tool_calls[0].name == "get_weather"  # one tool: it breaks the arguments
    assert "city" not in orjson.loads(single[0].tool_calls[0].arguments)


def test_schema_drift_drops_a_required_key_of_json_answers_only():
    plain, drifted = answered(Persona.SCHEMA_DRIFT, 1.0, json_request(1))
    assert set(orjson.loads(plain[0].text)) == {"note", "total"}
    assert set(orjson.loads(drifted[0].text)) == {"note"}
    text_request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    plain, drifted = answered(Persona.SCHEMA_DRIFT, 1.0, text_request)
    assert drifted == plain


def test_refuser_refuses():
    _, drifted = answered(Persona.REFUSER, 1.0, json_request(1))
    assert drifted[0].text == persona.REFUSAL and drifted[0].finish_reason == "stop"


@pytest.mark.parametrize("share", [0.1, 0.3, 0.7])
def test_the_share_drifts_about_that_share_of_distinct_requests_the_same_way_every_time(share):
    drifted = [
        answered(Persona.REFUSER, share, json_request(i))[1][0].text == persona.REFUSAL for i in range(2000)
    ]
    assert abs(sum(drifted) / 2000 - share) < 0.04
    again = [
        answered(Persona.REFUSER, share, json_request(i))[1][0].text == persona.REFUSAL for i in range(2000)
    ]
    assert again == drifted  # a function of the seed and the body, not of order or time
    other_seed = [
        answered(Persona.REFUSER, share, json_request(i), seed=4)[1][0].text == persona.REFUSAL
        for i in range(2000)
    ]
    assert other_seed != drifted
