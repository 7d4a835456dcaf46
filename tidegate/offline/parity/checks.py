"""Is an answer good, and does it agree with the reference's? Each failed check is named, so a
report can say which cases an endpoint failed and how. The agreement rules themselves are
shared with shadow traffic (router/record/agreement.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from router.openai import format_schema, response_format
from router.record import agreement, linear
from router.record.answer import Answer
from tidegate.offline.parity.suite import Case, as_list

Check = Callable[[Case, Answer, Any], str | None]  # (case, answer, the expectation) -> why it failed


def failures(case: Case, answer: Answer) -> list[str]:
    """The names of the case's expectations the answer misses, each with a short why."""
    found = []
    for name, wanted in case.expect.items():
        why = _CHECKS[name](case, answer, wanted)
        if why is not None:
            found.append(f"{name}: {why}")
    return found


def _json_schema(case: Case, answer: Answer, schema: Any) -> str | None:
    if schema is True:
        schema = requested_schema(case.request)
        if schema is None:
            return "the request asks for no JSON Schema (response_format)"
    try:
        document = answer.json_document()
    except ValueError:
        return "the answer is not JSON"
    error = linear.first_error(document, schema)
    return None if error is None else _short(error)


def requested_schema(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema of a request's response_format (chat) or text.format (Responses)."""
    fmt = response_format(request)
    return format_schema(fmt) if fmt is not None and fmt.get("type") == "json_schema" else None


def _tool_call(case: Case, answer: Answer, wanted: Any) -> str | None:
    if not answer.tool_calls:
        return "no tool call"
    call = answer.tool_calls[0]
    if call.name != wanted["name"]:
        return f"called {call.name!r}, not {wanted['name']!r}"
    try:
        arguments = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return "its arguments are not JSON"
    schema = wanted.get("arguments")
    if schema is None:
        return None
    error = linear.first_error(arguments, schema)
    return None if error is None else "arguments: " + _short(error)


def _regex(case: Case, answer: Answer, pattern: Any) -> str | None:
    return None if linear.pattern(pattern).search(answer.text) else f"no match for {_short(pattern)}"


def _contains(case: Case, answer: Answer, wanted: Any) -> str | None:
    missing = [w for w in as_list(wanted) if w not in answer.text]
    return None if not missing else f"missing {_short(missing[0])!r}"


def _not_contains(case: Case, answer: Answer, wanted: Any) -> str | None:
    present = [w for w in as_list(wanted) if w in answer.text]
    return None if not present else f"contains {_short(present[0])!r}"


def _finish_reason(case: Case, answer: Answer, wanted: Any) -> str | None:
    return None if answer.finish_reason in as_list(wanted) else f"finished with {answer.finish_reason!r}"


def _max_output_tokens(case: Case, answer: Answer, limit: Any) -> str | None:
    if answer.output_tokens is None:
        return "no usage in the answer"
    return None if answer.output_tokens <= limit else f"{answer.output_tokens} tokens"


def _refusal(case: Case, answer: Answer, wanted: Any) -> str | None:
    if wanted == "expected":
        return None if answer.refused else "answered instead of refusing"
    return None if not answer.refused else "refused"


_CHECKS: Mapping[str, Check] = {
    "json_schema": _json_schema,
    "tool_call": _tool_call,
    "regex": _regex,
    "contains": _contains,
    "not_contains": _not_contains,
    "finish_reason": _finish_reason,
    "max_output_tokens": _max_output_tokens,
    "refusal": _refusal,
}


def agrees(case: Case, answer: Answer, references: Sequence[Answer]) -> bool | None:
    """Whether the answer agrees with at least one of the reference's answers to the case on
    every rule of its `agree` (router/record/agreement.py); None: no rule, or no reference."""
    return agreement.agrees(case.agree, answer, references)


def _short(value: Any, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
