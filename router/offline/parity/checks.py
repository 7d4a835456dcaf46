"""Is an answer good, and does it agree with the reference's? Each failed check is named, so a
report can say which cases an endpoint failed and how."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema
import orjson

from router.offline.parity.answer import Answer
from router.offline.parity.suite import Case, as_list

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
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(document))
    return None if error is None else _short(error.message)


def requested_schema(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema of a request's response_format (chat) or text.format (Responses)."""
    fmt = request.get("response_format")
    if not isinstance(fmt, dict):
        text = request.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema", fmt)
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return schema if isinstance(schema, dict) else None


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
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    return None if error is None else "arguments: " + _short(error.message)


def _regex(case: Case, answer: Answer, pattern: Any) -> str | None:
    return None if re.search(pattern, answer.text) else f"no match for {_short(pattern)}"


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
    every rule of `agree` (None: the case has no rule, or the reference gave no answer)."""
    rules = {k: v for k, v in case.agree.items() if v is not False}
    if not rules or not references:
        return None
    return any(all(_AGREE[rule](answer, ref, value) for rule, value in rules.items()) for ref in references)


def _document(answer: Answer) -> Any:
    try:
        return answer.json_document()
    except ValueError:
        return _UNPARSED


_UNPARSED = object()


def _json_keys(answer: Answer, reference: Answer, _: Any) -> bool:
    mine, theirs = _document(answer), _document(reference)
    return isinstance(mine, dict) and isinstance(theirs, dict) and set(mine) == set(theirs)


def _json_values(answer: Answer, reference: Answer, paths: Any) -> bool:
    mine, theirs = _document(answer), _document(reference)
    if mine is _UNPARSED or theirs is _UNPARSED:
        return False
    return all(_at(mine, path) == _at(theirs, path) for path in paths)


def _at(document: Any, path: str) -> Any:
    """The value at a dotted path ('order.items.0.id'); _UNPARSED when the path is not there."""
    for part in path.split("."):
        if isinstance(document, dict) and part in document:
            document = document[part]
        elif isinstance(document, list) and part.isdigit() and int(part) < len(document):
            document = document[int(part)]
        else:
            return _UNPARSED
    return document


def _tool_name(answer: Answer, reference: Answer, _: Any) -> bool:
    return [c.name for c in answer.tool_calls] == [c.name for c in reference.tool_calls]


def _label(answer: Answer, reference: Answer, pattern: Any) -> bool:
    mine, theirs = re.search(pattern, answer.text), re.search(pattern, reference.text)
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return mine.group(mine.lastindex or 0) == theirs.group(theirs.lastindex or 0)


_AGREE: Mapping[str, Callable[[Answer, Answer, Any], bool]] = {
    "exact": lambda answer, reference, _: (
        answer.text.strip() == reference.text.strip() and _tool_name(answer, reference, None)
    ),
    "json_keys": _json_keys,
    "json_values": _json_values,
    "tool_name": _tool_name,
    "label": _label,
}


def _short(value: Any, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
