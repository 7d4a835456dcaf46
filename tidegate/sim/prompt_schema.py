"""A JSON Schema written into a request's prompt, as JSON-mode clients send one (instructor's
JSON and MD_JSON modes put the model's schema in the system message), so the simulator can
answer with an object that fits what the prompt asks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

_SCANNED_CHARS = 64 * 1024  # of the prompt's text, for `{` that may open a schema
_CANDIDATES = 64  # `{` tried at most, so a prompt full of braces costs little
_DECODER = json.JSONDecoder()


def schema_in_prompt(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The first JSON object in the prompt's text that reads as an object schema (it has
    `properties`, or `$defs` and a `type`), else None."""
    for text in _texts(payload):
        for found in _objects(text[:_SCANNED_CHARS]):
            if isinstance(found, dict) and _is_schema(found):
                return found
    return None


def _is_schema(found: dict[str, Any]) -> bool:
    return isinstance(found.get("properties"), dict) or ("$defs" in found and "type" in found)


def _objects(text: str) -> Iterator[Any]:
    at, tried = text.find("{"), 0
    while at != -1 and tried < _CANDIDATES:
        tried += 1
        try:
            found, end = _DECODER.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        yield found
        at = text.find("{", end)


def _texts(payload: dict[str, Any]) -> Iterator[str]:
    """The prompt's text pieces: chat messages, Responses input and instructions."""
    for key in ("instructions", "input", "messages", "prompt"):
        yield from _strings(payload.get(key))


def _strings(node: Any, depth: int = 0) -> Iterator[str]:
    if depth > 6:
        return
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, depth + 1)
    elif isinstance(node, dict):
        for key in ("content", "text"):
            yield from _strings(node.get(key), depth + 1)
