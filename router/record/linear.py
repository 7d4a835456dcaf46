"""Pattern and schema checks that run in time linear in the text they read, whoever wrote the
pattern: a client's `response_format` schema, an operator's agreement rule or parity case.
Regular expressions are RE2's (google-re2), and JSON Schemas are checked by jsonschema-rs with
its linear-time engine for `pattern` and `patternProperties`; neither can backtrack, so no
answer or pattern can hold the event loop (issue 35). Neither fetches anything: a remote
`$ref` is refused. RE2 has no lookaround and no backreferences; a pattern that uses them is
refused where it is configured (a config or suite error naming it)."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema_rs
import orjson
import re2

_RE2 = re2.Options()
_RE2.log_errors = False  # a refused pattern is our error to report, not a line on stderr
_LINEAR = jsonschema_rs.RegexOptions()

Pattern = Any  # re2's compiled pattern (untyped)


@functools.lru_cache(maxsize=256)  # the operators' patterns: a few, used on every comparison
def pattern(text: str) -> Pattern:
    """`text` compiled by RE2; ValueError saying why when it is not one RE2 takes."""
    try:
        return re2.compile(text, _RE2)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"not a regular expression RE2 takes ({reason})") from None


def validator(schema: Any) -> Any:
    """A jsonschema-rs validator for `schema` (its draft from `$schema`, 2020-12 by default);
    jsonschema_rs.ValidationError for a schema that is not one, ValueError for one nested
    too deeply."""
    return jsonschema_rs.validator_for(schema, pattern_options=_LINEAR, offline=True, validate_formats=False)


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a JSON Schema these checks can apply (None: it is one)."""
    try:
        validator(schema)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        return str(getattr(exc, "message", exc)).splitlines()[0]
    return None


def first_error(instance: Any, schema: Any) -> str | None:
    """The first way `instance` misses `schema` (None: it matches)."""
    for error in validator(schema).iter_errors(instance):
        return str(error.message)
    return None


def matches(instance: Any, schema: bytes | dict[str, Any]) -> bool:
    """Whether `instance` matches a client's JSON Schema. A schema these checks cannot apply
    (lookaround or backreferences in a pattern, an unknown draft, not JSON) is not the
    answer's fault: True."""
    try:
        found = orjson.loads(schema) if isinstance(schema, bytes) else schema
        return bool(validator(found).is_valid(instance))
    except (jsonschema_rs.ValidationError, orjson.JSONDecodeError, ValueError, TypeError):
        return True
