"""Does an answer agree with another endpoint's answer to the same request? The rules a
parity suite's `agree` and a shadow's `compare.agree` name (docs/parity.md):

- `exact`: the same text (stripped) and the same tool calls by name;
- `json_keys`: both are JSON objects with the same top-level keys;
- `json_values: [paths]`: the same values at these dotted paths (`order.items.0.id`);
- `tool_name`: the same tools called, in order;
- `label: REGEX`: the same first match (its last group) of the pattern in both, or none in both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.record import linear
from router.record.answer import Answer

RULES = ("exact", "json_keys", "json_values", "tool_name", "label")


def check_rules(rules: Any) -> dict[str, Any]:
    """The rules as a mapping, checked: a rule's name alone (`json_keys`) means it is on.
    ValueError names the rule at fault."""
    if isinstance(rules, str):
        rules = {rules: True}
    if not isinstance(rules, dict):
        raise ValueError("must be a rule's name or an object of rules")
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        raise ValueError(f"{unknown[0]} is not one of {', '.join(RULES)}")
    for key in ("exact", "json_keys", "tool_name"):
        if key in rules and not isinstance(rules[key], bool):
            raise ValueError(f"{key} must be true or false")
    paths = rules.get("json_values")
    if paths is not None and not (
        isinstance(paths, list | tuple) and paths and all(isinstance(p, str) and p for p in paths)
    ):
        raise ValueError("json_values must be a list of paths such as 'order.id'")
    if "label" in rules:
        if not isinstance(rules["label"], str):
            raise ValueError("label must be a regular expression (a string)")
        try:
            linear.pattern(rules["label"])
        except ValueError as exc:
            raise ValueError(f"label: {exc}") from None
    return dict(rules)


def agrees(rules: Mapping[str, Any], answer: Answer, references: Sequence[Answer]) -> bool | None:
    """Whether the answer agrees with at least one of the references on every rule that is on
    (None: no rule is on, or there is no reference to compare with)."""
    active = {k: v for k, v in rules.items() if v is not False}
    if not active or not references:
        return None
    return any(all(_AGREE[rule](answer, ref, value) for rule, value in active.items()) for ref in references)


_UNPARSED = object()


def _document(answer: Answer) -> Any:
    try:
        return answer.json_document()
    except ValueError:
        return _UNPARSED


def _json_keys(answer: Answer, reference: Answer, _: Any) -> bool:
    mine, theirs = _document(answer), _document(reference)
    return isinstance(mine, dict) and isinstance(theirs, dict) and set(mine) == set(theirs)


def _json_values(answer: Answer, reference: Answer, paths: Any) -> bool:
    mine, theirs = _document(answer), _document(reference)
    if mine is _UNPARSED or theirs is _UNPARSED:
        return False
    return all(_at(mine, path) == _at(theirs, path) for path in paths)


def _at(document: Any, path: str) -> Any:
    """The value at a dotted path; _UNPARSED when the path is not there."""
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
    compiled = linear.pattern(pattern)
    mine, theirs = compiled.search(answer.text), compiled.search(reference.text)
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return bool(mine.group(mine.lastindex or 0) == theirs.group(theirs.lastindex or 0))


def _exact(answer: Answer, reference: Answer, _: Any) -> bool:
    return answer.text.strip() == reference.text.strip() and _tool_name(answer, reference, None)


_AGREE: Mapping[str, Callable[[Answer, Answer, Any], bool]] = {
    "exact": _exact,
    "json_keys": _json_keys,
    "json_values": _json_values,
    "tool_name": _tool_name,
    "label": _label,
}
