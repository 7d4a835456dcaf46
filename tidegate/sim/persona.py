"""How a simulated model diverges from a faithful one: the personas `tidegate parity` is
tested against (docs/parity.md).

- `faithful`: answers as tidegate/sim/answers.py plans them.
- `schema-drift`: a share of JSON answers (response_format, or a schema in the prompt) miss
  a key: the first required property of the top-level object (else its first key).
- `tool-drift`: a share of tool calls go wrong: with more than one tool offered, half of them
  call another tool; the rest (and all with one tool) drop a required argument.
- `refuser`: a share of requests are refused ("I'm sorry, but I can't help with that."),
  finishing with `stop`.

Which requests drift is decided by a hash of the simulator's seed and the request body, never
by arrival order: the same suite against the same persona and seed drifts on the same cases
at any concurrency, so tests can hold exact figures. Repeating a request repeats its answer.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import orjson

from router.openai import format_schema, response_format
from tidegate.sim.answers import Choice, ToolCall
from tidegate.sim.profile import Persona
from tidegate.sim.prompt_schema import schema_in_prompt

REFUSAL = "I'm sorry, but I can't help with that."


def draw(seed: int | None, payload: dict[str, Any]) -> float:
    """A uniform number in [0, 1) fixed by the seed and the request's content."""
    body = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.blake2b(body, digest_size=8, key=str(seed or 0).encode()).digest()
    return int.from_bytes(digest, "big") / 2**64


def apply(
    persona: Persona, share: float, seed: int | None, payload: dict[str, Any], choices: tuple[Choice, ...]
) -> tuple[Choice, ...]:
    """The choices as this persona answers them."""
    if persona is Persona.FAITHFUL:
        return choices
    u = draw(seed, payload)
    if u >= share:
        return choices
    if persona is Persona.REFUSER:
        return tuple(Choice(tuple(_words(REFUSAL)), "stop") for _ in choices)
    if persona is Persona.SCHEMA_DRIFT:
        required = _required_keys(_asked_schema(payload))
        return tuple(_without_key(c, required) for c in choices)
    flip = u < share / 2  # tool-drift: which way it goes
    return tuple(_drifted_call(c, payload, flip=flip) for c in choices)


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + words[-1:]


def _asked_schema(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema the request asked for: response_format's (chat) or text.format's
    (Responses), else one carried in the prompt."""
    fmt = response_format(payload)
    if fmt is not None and fmt.get("type") == "json_schema":
        return format_schema(fmt)
    return schema_in_prompt(payload)


def _required_keys(schema: dict[str, Any] | None) -> list[str]:
    required = schema.get("required") if isinstance(schema, dict) else None
    return [r for r in required or () if isinstance(r, str)]


def _without_key(choice: Choice, required: list[str]) -> Choice:
    """The choice's JSON object (bare or in a ```json fence) missing its first required key
    (else its first key); other answers as they were."""
    text = choice.text
    fenced = text.startswith("```json\n") and text.endswith("\n```")
    inner = text[8:-4] if fenced else text
    try:
        document = orjson.loads(inner)
    except orjson.JSONDecodeError:
        return choice
    if not isinstance(document, dict) or not document:
        return choice
    document.pop(next((k for k in required if k in document), next(iter(document))))
    dumped = orjson.dumps(document).decode()
    drifted = "```json\n" + dumped + "\n```" if fenced else dumped
    return replace(choice, pieces=tuple(drifted[i : i + 4] for i in range(0, len(drifted), 4)))


def _drifted_call(choice: Choice, payload: dict[str, Any], *, flip: bool) -> Choice:
    if not choice.tool_calls:
        return choice
    names = [n for n in (_tool_name(t) for t in payload.get("tools") or ()) if n is not None]
    calls = []
    for call in choice.tool_calls:
        others = [n for n in names if n != call.name]
        if flip and others:
            calls.append(ToolCall(call.id, others[0], call.arguments))
            continue
        arguments = orjson.loads(call.arguments)
        required = _required_keys(_parameters(payload, call.name))
        if isinstance(arguments, dict) and arguments:
            key = next((k for k in required if k in arguments), next(iter(arguments)))
            arguments.pop(key)
        calls.append(ToolCall(call.id, call.name, orjson.dumps(arguments).decode()))
    return replace(choice, tool_calls=tuple(calls))


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    inner = tool.get("function")
    name = (inner if isinstance(inner, dict) else tool).get("name")
    return name if isinstance(name, str) else None


def _parameters(payload: dict[str, Any], name: str) -> dict[str, Any] | None:
    for tool in payload.get("tools") or ():
        if _tool_name(tool) != name:
            continue
        inner = tool.get("function")
        params = (inner if isinstance(inner, dict) else tool).get("parameters")
        return params if isinstance(params, dict) else None
    return None
