"""A parity suite: one JSON object a line, each a case the production suite holds a model to
(docs/parity.md has the format and examples/parity-suite.jsonl a worked example).

    {"id": "weather-call", "api": "chat", "request": {...the body, without "model"...},
     "expect": {"tool_call": {"name": "get_weather", "arguments": {...JSON Schema...}},
                "finish_reason": "tool_calls", "refusal": "forbidden"},
     "agree": {"tool_name": true}}

A line that cannot be used is refused with its line number and the key at fault, before any
request is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from router.openai import output_limit
from router.record import linear
from router.record.agreement import RULES, check_rules

APIS = ("chat", "responses")  # /chat/completions and /responses
EXPECTATIONS = (
    "json_schema",
    "tool_call",
    "regex",
    "contains",
    "not_contains",
    "finish_reason",
    "max_output_tokens",
    "refusal",
)
MAX_CASES = 10_000


class SuiteError(ValueError):
    """The suite cannot be used; the message names the line and the key."""


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    api: str
    request: Mapping[str, Any]
    expect: Mapping[str, Any] = field(default_factory=dict)
    agree: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_output_tokens(self) -> int | None:
        return output_limit(self.request)


def load_suite(path: Path) -> list[Case]:
    cases: list[Case] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith(b"#"):
            continue
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise SuiteError(f"{path}:{number}: not JSON ({exc})") from None
        case = parse_case(raw, f"{path}:{number}")
        if case.id in seen:
            raise SuiteError(f"{path}:{number}: id {case.id!r} appears twice")
        seen.add(case.id)
        cases.append(case)
        if len(cases) > MAX_CASES:
            raise SuiteError(f"{path}: more than {MAX_CASES} cases")
    if not cases:
        raise SuiteError(f"{path}: no cases")
    return cases


def parse_case(raw: Any, where: str) -> Case:
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: a case is a JSON object")
    unknown = set(raw) - {"id", "api", "request", "expect", "agree"}
    if unknown:
        raise SuiteError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    case_id = raw.get("id")
    if not isinstance(case_id, str) or not case_id:
        raise SuiteError(f"{where}: 'id' must be a non-empty string")
    api = raw.get("api", "chat")
    if api not in APIS:
        raise SuiteError(f"{where}: 'api' must be one of {', '.join(APIS)}")
    request = raw.get("request")
    wanted = "messages" if api == "chat" else "input"
    if not isinstance(request, dict) or wanted not in request:
        raise SuiteError(f"{where}: 'request' must be a {api} request body with {wanted!r}")
    if "model" in request or request.get("stream") is True:
        raise SuiteError(f"{where}: 'request' sets no 'model' (each endpoint's is used) and no 'stream'")
    expect = _section(raw, "expect", EXPECTATIONS, where)
    agree = _section(raw, "agree", RULES, where)
    _check_expect(expect, f"{where}: expect")
    _check_agree(agree, f"{where}: agree")
    return Case(case_id, api, request, expect, agree)


def _section(raw: dict[str, Any], key: str, known: tuple[str, ...], where: str) -> dict[str, Any]:
    section = raw.get(key, {})
    if not isinstance(section, dict):
        raise SuiteError(f"{where}: {key!r} must be an object")
    unknown = set(section) - set(known)
    if unknown:
        raise SuiteError(f"{where}: {key}.{sorted(unknown)[0]} is not one of {', '.join(known)}")
    return section


def _check_expect(expect: dict[str, Any], where: str) -> None:
    schema = expect.get("json_schema")
    if schema is not None and schema is not True:
        _schema(schema, f"{where}.json_schema")
    call = expect.get("tool_call")
    if call is not None:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise SuiteError(f"{where}.tool_call must be {{name, arguments (a JSON Schema, optional)}}")
        if "arguments" in call:
            _schema(call["arguments"], f"{where}.tool_call.arguments")
    if "regex" in expect:
        _regex(expect["regex"], f"{where}.regex")
    for key in ("contains", "not_contains", "finish_reason"):
        if key in expect and not _strings(expect[key]):
            raise SuiteError(f"{where}.{key} must be a string or a list of strings")
    limit = expect.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise SuiteError(f"{where}.max_output_tokens must be a positive integer")
    if expect.get("refusal", "expected") not in ("expected", "forbidden"):
        raise SuiteError(f"{where}.refusal must be 'expected' or 'forbidden'")


def _check_agree(agree: dict[str, Any], where: str) -> None:
    try:
        check_rules(agree)
    except ValueError as exc:
        raise SuiteError(f"{where}.{exc}") from None


def _schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise SuiteError(f"{where} must be a JSON Schema object")
    problem = linear.schema_problem(schema)
    if problem is not None:
        raise SuiteError(f"{where}: not a valid JSON Schema ({problem})")


def _regex(pattern: Any, where: str) -> None:
    if not isinstance(pattern, str):
        raise SuiteError(f"{where} must be a regular expression (a string)")
    try:
        linear.pattern(pattern)
    except ValueError as exc:
        raise SuiteError(f"{where}: {exc}") from None


def _strings(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    )


def as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)
