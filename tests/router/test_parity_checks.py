"""The parity suite's format, its checks and agreement rules, and the verdict arithmetic
(tidegate/offline/parity/)."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.record.answer import Answer, ToolUse, read_answer
from tidegate.offline.parity.checks import agrees, failures
from tidegate.offline.parity.suite import SuiteError, load_suite, parse_case
from tidegate.offline.parity.verdict import (
    DIVERGES,
    INCONCLUSIVE,
    PARITY,
    Outcome,
    case_matrix,
    failed_cases,
    summarise,
    verdict,
    wilson,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def case(expect=None, agree=None, request=None, api="chat"):
    raw = {"id": "c", "api": api, "request": request or CHAT, "expect": expect or {}, "agree": agree or {}}
    return parse_case(raw, "suite:1")


def chat_body(content=None, tool_calls=(), finish="stop", refusal=None, tokens=5):
    message = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(tool_calls)
        ]
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"completion_tokens": tokens},
    }


def test_the_example_suite_loads():
    cases = load_suite(__import__("pathlib").Path(__file__).parents[2] / "examples" / "parity-suite.jsonl")
    assert len(cases) >= 8 and len({c.id for c in cases}) == len(cases)
    assert {c.api for c in cases} == {"chat", "responses"}


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"request": CHAT}, "'id'"),
        ({"id": "a", "request": {"input": "x"}}, "'messages'"),
        ({"id": "a", "api": "responses", "request": CHAT}, "'input'"),
        ({"id": "a", "request": {**CHAT, "model": "x"}}, "'model'"),
        ({"id": "a", "request": {**CHAT, "stream": True}}, "'stream'"),
        ({"id": "a", "request": CHAT, "expect": {"regx": "x"}}, "expect.regx"),
        ({"id": "a", "request": CHAT, "expect": {"regex": "("}}, "expect.regex"),
        ({"id": "a", "request": CHAT, "expect": {"json_schema": {"type": 3}}}, "expect.json_schema"),
        ({"id": "a", "request": CHAT, "expect": {"tool_call": {"arguments": {}}}}, "expect.tool_call"),
        ({"id": "a", "request": CHAT, "expect": {"refusal": "maybe"}}, "expect.refusal"),
        ({"id": "a", "request": CHAT, "expect": {"max_output_tokens": 0}}, "expect.max_output_tokens"),
        ({"id": "a", "request": CHAT, "expect": {"contains": []}}, "expect.contains"),
        ({"id": "a", "request": CHAT, "agree": {"json_values": []}}, "agree.json_values"),
        ({"id": "a", "request": CHAT, "agree": {"label": "["}}, "agree.label"),
        ({"id": "a", "request": CHAT, "agree": {"same": True}}, "agree.same"),
        ({"id": "a", "request": CHAT, "extra": 1}, "'extra'"),
    ],
)
def test_a_bad_case_is_refused_naming_the_key(raw, named):
    with pytest.raises(SuiteError) as refused:
        parse_case(raw, "suite:7")
    assert "suite:7" in str(refused.value) and named in str(refused.value)


def test_a_duplicate_id_bad_json_and_an_empty_suite_are_refused(tmp_path):
    suite = tmp_path / "s.jsonl"
    line = orjson.dumps({"id": "a", "request": CHAT}).decode()
    for text, named in (
        (f"{line}\n{line}\n", ":2: id 'a' appears twice"),
        ("{nope\n", ":1: not JSON"),
        ("# c\n\n", "no cases"),
    ):
        suite.write_text(text)
        with pytest.raises(SuiteError, match=named):
            load_suite(suite)


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("expect", "body", "failed"),
    [
        ({"json_schema": SCHEMA}, chat_body('{"a": "x"}'), []),
        ({"json_schema": SCHEMA}, chat_body('```json\n{"a": "x"}\n```'), []),
        ({"json_schema": SCHEMA}, chat_body('{"b": 1}'), ["json_schema"]),
        ({"json_schema": SCHEMA}, chat_body("not json"), ["json_schema"]),
        (
            {"tool_call": {"name": "f", "arguments": SCHEMA}},
            chat_body(None, [("f", '{"a": "x"}')], "tool_calls"),
            [],
        ),
        (
            {"tool_call": {"name": "f", "arguments": SCHEMA}},
            chat_body(None, [("g", '{"a": "x"}')], "tool_calls"),
            ["tool_call"],
        ),
        (
            {"tool_call": {"name": "f", "arguments": SCHEMA}},
            chat_body(None, [("f", "{}")], "tool_calls"),
            ["tool_call"],
        ),
        ({"tool_call": {"name": "f"}}, chat_body(None, [("f", "{broken")], "tool_calls"), ["tool_call"]),
        ({"tool_call": {"name": "f"}}, chat_body("text"), ["tool_call"]),
        ({"regex": r"\d{3}"}, chat_body("code 123"), []),
        ({"regex": r"\d{3}"}, chat_body("code"), ["regex"]),
        ({"contains": ["a", "b"]}, chat_body("a b"), []),
        ({"contains": "c"}, chat_body("a b"), ["contains"]),
        ({"not_contains": "secret"}, chat_body("the secret"), ["not_contains"]),
        ({"finish_reason": ["stop", "length"]}, chat_body("x", finish="length"), []),
        ({"finish_reason": "stop"}, chat_body("x", finish="content_filter"), ["finish_reason"]),
        ({"max_output_tokens": 5}, chat_body("x", tokens=6), ["max_output_tokens"]),
        ({"refusal": "forbidden"}, chat_body("I'm sorry, but I can't help with that."), ["refusal"]),
        ({"refusal": "forbidden"}, chat_body(None, refusal="No."), ["refusal"]),
        ({"refusal": "expected"}, chat_body("Sure, here it is."), ["refusal"]),
        ({"refusal": "expected"}, chat_body("I cannot assist with that."), []),
    ],
)
def test_each_expectation_passes_and_fails(expect, body, failed):
    found = failures(case(expect), read_answer("chat", body))
    assert [f.split(":")[0] for f in found] == failed


def test_json_schema_true_uses_the_requests_response_format():
    request = {
        **CHAT,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    }
    c = case({"json_schema": True}, request=request)
    assert failures(c, read_answer("chat", chat_body('{"a": "x"}'))) == []
    assert failures(c, read_answer("chat", chat_body("{}")))[0].startswith("json_schema")
    assert (
        "asks for no JSON Schema"
        in failures(case({"json_schema": True}), read_answer("chat", chat_body("{}")))[0]
    )


def test_a_responses_body_is_read_like_a_chat_one():
    body = {
        "status": "completed",
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": '{"a": "x"}'}]},
        ],
        "usage": {"output_tokens": 4},
    }
    answer = read_answer("responses", body)
    assert answer.text == '{"a": "x"}' and answer.finish_reason == "stop" and answer.output_tokens == 4
    call = read_answer(
        "responses",
        {"status": "completed", "output": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
    )
    assert call.tool_calls == (ToolUse("f", "{}"),) and call.finish_reason == "tool_calls"
    assert read_answer("responses", {"status": "incomplete", "output": []}).finish_reason == "length"
    with pytest.raises(ValueError):
        read_answer("chat", {"choices": []})


def answer(text="", calls=()):
    return Answer(text, "stop", tuple(ToolUse(n, "{}") for n in calls))


@pytest.mark.parametrize(
    ("agree", "mine", "theirs", "expected"),
    [
        ({"exact": True}, answer("a b"), [answer("a b ")], True),
        ({"exact": True}, answer("a b"), [answer("a c"), answer("a b")], True),  # any reference answer
        ({"exact": True}, answer("a b"), [answer("a c")], False),
        ({"json_keys": True}, answer('{"a":1,"b":2}'), [answer('{"b":3,"a":4}')], True),
        ({"json_keys": True}, answer('{"a":1}'), [answer('{"a":1,"b":2}')], False),
        ({"json_keys": True}, answer("nope"), [answer("nope")], False),
        (
            {"json_values": ["o.id", "l.0"]},
            answer('{"o":{"id":7},"l":[1]}'),
            [answer('{"o":{"id":7},"l":[1,2]}')],
            True,
        ),
        ({"json_values": ["o.id"]}, answer('{"o":{"id":7}}'), [answer('{"o":{"id":8}}')], False),
        ({"tool_name": True}, answer(calls=["f"]), [answer(calls=["f"])], True),
        ({"tool_name": True}, answer(calls=["g"]), [answer(calls=["f"])], False),
        ({"label": r"\b(yes|no)\b"}, answer("I say yes."), [answer("yes, sure")], True),
        ({"label": r"\b(yes|no)\b"}, answer("I say no."), [answer("yes, sure")], False),
        ({"label": r"\b(yes|no)\b"}, answer("maybe"), [answer("yes")], False),
        ({"tool_name": True}, answer(calls=["f"]), [], None),  # the reference gave no answer
        ({}, answer("x"), [answer("y")], None),  # no rule
    ],
)
def test_agreement_rules(agree, mine, theirs, expected):
    assert agrees(case(agree=agree), mine, theirs) is expected


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (5, 10, 0.2366, 0.7634), (81, 263, 0.2553, 0.3662)],
)
def test_wilson_interval_matches_published_values(k, n, low, high):
    found = wilson(k, n)
    assert found == pytest.approx((low, high), abs=1e-4)


@given(st.integers(0, 500), st.integers(1, 500))
def test_wilson_interval_holds_the_estimate_inside_0_1(k, n):
    k = min(k, n)
    low, high = wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0
    assert not math.isnan(low) and not math.isnan(high)


def outcomes(endpoint, passed, failed, *, disagree=0, error=0):
    found = [Outcome(endpoint, f"c{i}", 0, None, agreed=True) for i in range(passed)]
    found += [Outcome(endpoint, f"f{i}", 0, None, ("regex: no match",), agreed=True) for i in range(failed)]
    found += [Outcome(endpoint, f"d{i}", 0, None, agreed=False) for i in range(disagree)]
    found += [Outcome(endpoint, f"e{i}", 0, "http_500") for i in range(error)]
    return found


def judged(ref, other, min_agreement=0.95):
    return verdict(summarise("x", other), summarise("ref", ref), min_agreement)[0]


def test_verdicts():
    reference = outcomes("ref", 30, 0)
    assert judged(reference, outcomes("x", 30, 0)) == PARITY
    assert judged(reference, outcomes("x", 10, 20)) == DIVERGES  # intervals apart
    assert judged(reference, outcomes("x", 28, 2)) == INCONCLUSIVE  # lower, intervals overlap
    assert judged(reference, outcomes("x", 27, 0, disagree=3)) == DIVERGES  # agreement 90%
    assert judged(reference, outcomes("x", 30, 0), min_agreement=1.0) == PARITY
    assert judged(reference, outcomes("x", 0, 0, error=5)) == INCONCLUSIVE


def test_the_case_matrix_names_how_each_case_failed():
    found = outcomes("x", 1, 1, disagree=1, error=1)
    matrix = case_matrix(found)
    assert matrix["f0"]["x"] == {"passed": 0, "repeats": 1, "disagreed": 0, "how": ["regex: no match"]}
    assert matrix["e0"]["x"]["how"] == ["http_500"]
    assert matrix["d0"]["x"]["how"] == ["disagrees with the reference"]
    assert failed_cases(matrix, "x") == ["f0", "d0", "e0"]


def test_mirrored_samples_the_percent_by_request_id_and_obeys_the_header_and_size():
    from router.config import ModelConfig, ShadowConfig  # noqa: PLC0415
    from router.config.endpoints import ServerlessEndpoint  # noqa: PLC0415
    from router.openai import RequestPeek  # noqa: PLC0415
    from router.request.mirror import mirrored  # noqa: PLC0415

    sl = ServerlessEndpoint(usd_per_mtok_in=0, usd_per_mtok_out=0, name="s", base_url="http://s/v1", model="m")
    model = ModelConfig(serverless=(sl,), shadow=ShadowConfig(endpoint="s", percent=10, max_prompt_tokens=100))
    peek = RequestPeek({}, "m", False, None, False, prompt_tokens=50)
    from router.request.asks import asks_of  # noqa: PLC0415

    chosen = [mirrored(model, peek, f"req-{i}") for i in range(5000)]
    assert abs(sum(chosen) / 5000 - 0.10) < 0.02
    assert chosen == [mirrored(model, peek, f"req-{i}") for i in range(5000)]  # by id: stable
    first = chosen.index(True)
    refused = asks_of([(b"x-tidegate-no-shadow", b" 1")]).no_shadow
    assert not mirrored(model, peek, f"req-{first}", refused)
    assert mirrored(model, peek, f"req-{first}", asks_of([(b"x-tidegate-no-shadow", b"0")]).no_shadow)
    assert mirrored(model, peek, f"req-{first}", asks_of([(b"x-tidegate-no-shadow", b"")]).no_shadow)
    big = RequestPeek({}, "m", False, None, False, prompt_tokens=101)
    assert not mirrored(model, big, f"req-{first}")
    assert not mirrored(ModelConfig(serverless=(sl,)), peek, f"req-{first}")


@pytest.mark.parametrize(
    ("shadow", "error"),
    [
        ({}, "give either endpoint"),
        ({"endpoint": "s", "candidate": {"name": "c", "usd_per_mtok_in": 0, "usd_per_mtok_out": 0, "base_url": "http://c/v1", "model": "m"}}, "give either endpoint"),
        ({"endpoint": "nope"}, "not an endpoint of this model"),
        ({"candidate": {"name": "s", "usd_per_mtok_in": 0, "usd_per_mtok_out": 0, "base_url": "http://c/v1", "model": "m"}}, "is taken"),
        ({"endpoint": "s", "percent": 0}, "percent"),
        ({"endpoint": "s", "compare": {"agree": "similar"}}, "agree"),
        ({"endpoint": "s", "compare": {"agree": {"label": "("}}}, "label"),
    ],
)
def test_a_bad_shadow_config_names_the_key(shadow, error):
    from router.config import ConfigError, parse_config  # noqa: PLC0415

    raw = {
        "models": {"m": {"serverless": [{"name": "s", "usd_per_mtok_in": 0, "usd_per_mtok_out": 0, "base_url": "http://s/v1", "model": "m"}], "shadow": shadow}}
    }
    with pytest.raises(ConfigError) as refused:
        parse_config(orjson.dumps(raw).decode(), {})
    assert error in str(refused.value) and "shadow" in str(refused.value)
