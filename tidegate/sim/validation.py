"""What vLLM's OpenAI server refuses with a 400 before generating: a missing required field,
or a field of the wrong type. One table per API, so a new field is a row."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _boolean(v: Any) -> bool:
    return isinstance(v, bool)


def _string(v: Any) -> bool:
    return isinstance(v, str)


def _messages(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in v)


def _prompt(v: Any) -> bool:
    return isinstance(v, str | list)


def _stop(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _object(v: Any) -> bool:
    return isinstance(v, dict)


def _list(v: Any) -> bool:
    return isinstance(v, list)


Check = Callable[[Any], bool]
_COMMON: dict[str, tuple[Check, str]] = {
    "model": (_string, "a string"),
    "stream": (_boolean, "a boolean"),
    "temperature": (_number, "a number"),
    "top_p": (_number, "a number"),
    "n": (_integer, "an integer"),
    "seed": (_integer, "an integer"),
    "max_tokens": (_integer, "an integer"),
    "presence_penalty": (_number, "a number"),
    "frequency_penalty": (_number, "a number"),
    "stop": (_stop, "a string or a list of strings"),
    "stream_options": (_object, "an object"),
    "user": (_string, "a string"),
}
FIELDS: Mapping[str, Mapping[str, tuple[Check, str]]] = MappingProxyType(
    {
        "chat": {
            **_COMMON,
            "messages": (_messages, "a list of messages with a role"),
            "max_completion_tokens": (_integer, "an integer"),
            "logprobs": (_boolean, "a boolean"),
            "top_logprobs": (_integer, "an integer"),
            "tools": (_list, "a list"),
            "response_format": (_object, "an object"),
        },
        "text": {**_COMMON, "prompt": (_prompt, "a string or a list"), "logprobs": (_integer, "an integer")},
        "responses": {
            "model": (_string, "a string"),
            "stream": (_boolean, "a boolean"),
            "temperature": (_number, "a number"),
            "max_output_tokens": (_integer, "an integer"),
            "tools": (_list, "a list"),
        },
        "embeddings": {
            "model": (_string, "a string"),
            "input": (_prompt, "a string or a list"),
            "dimensions": (_integer, "an integer"),
            "encoding_format": (_string, "a string"),
        },
    }
)
REQUIRED: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "chat": ("model", "messages"),
        "text": ("model", "prompt"),
        "responses": ("model", "input"),
        "embeddings": ("model", "input"),
    }
)


def problem(payload: Mapping[str, Any], kind: str) -> str | None:
    """What is wrong with `payload` for the `kind` API, in vLLM's words, or None."""
    for name in REQUIRED.get(kind, ()):
        if name not in payload:
            return f"Field required: {name}"
    for name, (check, expected) in FIELDS.get(kind, {}).items():
        if name in payload and payload[name] is not None and not check(payload[name]):
            return f"{name}: Input should be {expected}"
    return None
