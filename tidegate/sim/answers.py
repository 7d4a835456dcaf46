"""What the simulator answers to a request, decided before any byte is sent: per choice, the
text (or a JSON document for `response_format`, or tool calls), its token count and its
finish reason, the way vLLM's OpenAI server would. Deterministic for a request's `seed`.

- Text is words from a fixed list, one token each. It runs to `max_tokens` (`length`),
  unless the profile samples answer lengths (`answer_tokens_p50`) and the sampled answer
  is shorter (`stop`), or a `stop` sequence appears (`stop`, the sequence not included).
  With no `max_tokens` the answer is `default_output_tokens` long (or sampled) and stops.
  vLLM's `ignore_eos: true` runs it to `max_tokens` regardless.
- `response_format: json_object` answers a JSON object: an instance of the JSON Schema the
  prompt carries, when it carries one (tidegate/sim/prompt_schema.py), else
  `{"answer": "..."}`; `json_schema` an instance of the schema (`instance_of`). With no
  `response_format`, a prompt that carries a schema is answered with an instance of it in a
  fenced ```json block, as a model asked for markdown JSON would.
- `tools` with `tool_choice` `required` or a named function answer tool calls whose
  arguments are an instance of the function's parameters (`finish_reason: tool_calls`);
  with `auto`, a `tool_call_share` of requests do. After a tool result (the last message
  has role `tool`) the answer is text.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from router.openai import format_schema, output_limit, response_format
from tidegate.sim.profile import SimProfile
from tidegate.sim.prompt_schema import schema_in_prompt

_WORDS = ("the", "tide", "gate", "routes", "every", "token", "to", "a", "warm", "replica")


def word(i: int) -> str:
    return _WORDS[i % len(_WORDS)] + " "


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class Choice:
    pieces: tuple[str, ...]  # the content, one token per piece (empty for tool calls)
    finish_reason: str
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def tokens(self) -> int:
        return len(self.pieces) + sum(max(1, len(c.arguments) // 4) for c in self.tool_calls)


def plan(payload: dict[str, Any], profile: SimProfile, rng: random.Random) -> tuple[Choice, ...]:
    """The answer's choices (`n` of them)."""
    seed = payload.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        rng = random.Random(seed)
    n = payload.get("n")
    count = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    return tuple(_choice(payload, profile, rng, i) for i in range(count))


def _choice(payload: dict[str, Any], profile: SimProfile, rng: random.Random, index: int) -> Choice:
    calls = _tool_calls(payload, profile, rng, index)
    if calls:
        return Choice((), "tool_calls", calls)
    document = _document(payload, rng)
    if document is not None:
        return Choice(tuple(_split(document)), "stop")
    limit = output_limit(payload)
    length, finish = _length(payload, profile, rng, limit)
    pieces = [word(i) for i in range(length)]
    stopped = _stop_at(pieces, payload.get("stop"))
    if stopped is not None:
        return Choice(tuple(pieces[:stopped]), "stop")
    return Choice(tuple(pieces), finish)


def _length(
    payload: dict[str, Any], profile: SimProfile, rng: random.Random, limit: int | None
) -> tuple[int, str]:
    """Tokens of a text answer and its finish reason."""
    cap = min(limit, profile.max_output_tokens) if limit is not None else profile.max_output_tokens
    if limit is not None and payload.get("ignore_eos") is True:
        return cap, "length"
    if profile.answer_tokens_p50 is not None:
        wanted = max(1, round(profile.answer_tokens_p50 * math.exp(rng.gauss(0.0, 0.7))))
    elif limit is None:
        wanted = profile.default_output_tokens
    else:
        wanted = cap  # no sampled lengths: the answer runs to max_tokens
    if wanted >= cap and limit is not None:
        return cap, "length"
    return min(wanted, cap), "stop"


def _stop_at(pieces: list[str], stop: Any) -> int | None:
    """How many pieces come before the first stop sequence, if one appears."""
    sequences = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str)]
    sequences = [s for s in sequences if s]
    if not sequences:
        return None
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        if any(s in text for s in sequences):
            return i
    return None


def _split(text: str) -> list[str]:
    """A document as tokens of about four characters."""
    return [text[i : i + 4] for i in range(0, len(text), 4)] or [""]


def _document(payload: dict[str, Any], rng: random.Random) -> str | None:
    fmt = response_format(payload)
    if fmt is None:
        asked = schema_in_prompt(payload)
        if asked is None:
            return None
        return "```json\n" + orjson.dumps(instance_of(asked, rng, asked)).decode() + "\n```"
    if fmt.get("type") == "json_object":
        asked = schema_in_prompt(payload)
        if asked is not None:
            return orjson.dumps(instance_of(asked, rng, asked)).decode()
        return orjson.dumps({"answer": "the tide gate routes every token"}).decode()
    schema = format_schema(fmt) if fmt.get("type") == "json_schema" else None
    if schema is not None:
        return orjson.dumps(instance_of(schema, rng, schema)).decode()
    return None


def _tool_calls(
    payload: dict[str, Any], profile: SimProfile, rng: random.Random, index: int
) -> tuple[ToolCall, ...]:
    tools = [t for t in payload.get("tools") or () if isinstance(t, dict)]
    functions = [f for f in (_function(t) for t in tools) if f is not None]
    messages = payload.get("messages") or payload.get("input")
    if not functions or (
        isinstance(messages, list) and messages and _role(messages[-1]) in ("tool", "function_call_output")
    ):
        return ()
    choice = payload.get("tool_choice", "auto")
    if choice == "none":
        return ()
    named = _named(choice)
    if named is not None:
        functions = [f for f in functions if f.get("name") == named] or functions[:1]
    elif choice != "required" and rng.random() >= profile.tool_call_share:
        return ()
    picked = functions[0] if named is not None else rng.choice(functions)
    params = picked.get("parameters")
    arguments = instance_of(params, rng, params) if isinstance(params, dict) else {}
    call_id = f"call_{rng.getrandbits(64):016x}{index}"
    return (ToolCall(call_id, str(picked.get("name", "tool")), orjson.dumps(arguments).decode()),)


_TOOL_RESULTS = ("tool", "function_call_output")  # chat's and the Responses API's


def _function(tool: dict[str, Any]) -> dict[str, Any] | None:
    """A tool's function spec: chat's {"type": "function", "function": {...}} or the
    Responses API's flat {"type": "function", "name": ...}."""
    if tool.get("type") != "function":
        return None
    inner = tool.get("function")
    return inner if isinstance(inner, dict) else tool


def _named(choice: Any) -> str | None:
    if not isinstance(choice, dict):
        return None
    inner = choice.get("function")
    name = inner.get("name") if isinstance(inner, dict) else choice.get("name")
    return name if isinstance(name, str) else None


def _role(message: Any) -> str | None:
    if not isinstance(message, dict):
        return None
    role = message.get("role", message.get("type"))
    return role if isinstance(role, str) else None


def instance_of(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int = 0) -> Any:
    """A value valid against a JSON Schema (the subset structured outputs use: objects with
    properties and required, arrays, enums, consts, strings with formats, numbers, booleans,
    null, anyOf/oneOf/allOf and local $refs)."""
    if depth > 12:
        return None
    schema = _resolved(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    make = _BY_TYPE.get(kind if isinstance(kind, str) else "string", _BY_TYPE["string"])
    return make(schema, rng, root, depth)


def _resolved(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """`schema` with a local $ref followed, allOf merged, and anyOf/oneOf's first option taken."""
    for _ in range(12):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            schema = target if isinstance(target, dict) else {}
            continue
        options = schema.get("anyOf", schema.get("oneOf"))
        if isinstance(options, list) and options and isinstance(options[0], dict):
            schema = options[0]
            continue
        parts = schema.get("allOf")
        if isinstance(parts, list):
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                if isinstance(part, dict):
                    merged.update(part)
            schema = merged
            continue
        break
    return schema


Make = Callable[[dict[str, Any], random.Random, dict[str, Any], int], Any]


def _object(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> Any:
    properties = schema.get("properties") or {}
    return {
        name: instance_of(sub, rng, root, depth + 1)
        for name, sub in properties.items()
        if isinstance(sub, dict)
    }


def _array(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> Any:
    items = schema.get("items")
    count = max(1, int(schema.get("minItems", 1)))
    return [
        instance_of(items, rng, root, depth + 1) if isinstance(items, dict) else "x" for _ in range(count)
    ]


def _string(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> Any:
    value = _FORMATS.get(str(schema.get("format")), "tide")
    minimum = int(schema.get("minLength", 0))
    return value + "x" * max(0, minimum - len(value))


_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "email": "a@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
_BY_TYPE: dict[str, Make] = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": lambda schema, rng, root, depth: int(schema.get("minimum", 1)),
    "number": lambda schema, rng, root, depth: float(schema.get("minimum", 1.5)),
    "boolean": lambda schema, rng, root, depth: True,
    "null": lambda schema, rng, root, depth: None,
}
