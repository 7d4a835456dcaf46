"""Peek at an OpenAI request body without modelling it, and rewrite what must change.

The hot path parses the JSON once (orjson), reads `model`, `stream`, `user` and whether the
client asked for stream usage, and later serialises the same dict with the upstream's model
id. No schema validation of whole chat requests: the upstream does that and its error is
relayed to the client. The few fields the gateway itself relies on, or that would make an
upstream burn capacity for nothing (an absurd output-token limit), are checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from router.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class ApiPath:
    """What the gateway knows of one proxied OpenAI path (relative to /v1)."""

    operation: str  # OpenTelemetry's gen_ai.operation.name
    done_terminated: bool  # its streams end with `data: [DONE]` and may carry usage on request


PATHS: Mapping[str, ApiPath] = MappingProxyType(
    {
        "/chat/completions": ApiPath("chat", done_terminated=True),
        "/completions": ApiPath("text_completion", done_terminated=True),
        "/embeddings": ApiPath("embeddings", done_terminated=False),
        "/responses": ApiPath("chat", done_terminated=False),
    }
)


@dataclass(frozen=True, slots=True)
class RequestPeek:
    """What routing needs from a request body; `payload` is the parsed body (not copied)."""

    payload: dict[str, Any]
    model: str
    stream: bool
    user: str | None
    wants_usage: bool
    sequences: int = 1  # what the engine generates at once: max(n, best_of)
    prompt_tokens: int = 1  # a fast estimate (body bytes / 4) for predicted-TTFT admission
    caps_output: bool = False  # the client set max_tokens / max_completion_tokens / max_output_tokens


BYTES_PER_TOKEN = 4  # an English-text rule of thumb; the prefill model learns in these units
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def json_object(body: bytes, what: str = "request body") -> dict[str, Any]:
    """`body` parsed as a JSON object; InvalidRequest (400) for anything else."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return payload


def peek(body: bytes, max_output_tokens: int = 1 << 20, max_n: int = 8) -> RequestPeek:
    """Parse a JSON request body; raise InvalidRequest for anything routing cannot use."""
    payload = json_object(body)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("you must provide a model parameter", param="model")
    stream = payload.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    user = payload.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("'user' must be a string", param="user")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    _check_token_limits(payload, max_output_tokens)
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    return RequestPeek(
        payload=payload,
        model=model,
        stream=bool(stream),
        user=user if isinstance(user, str) else None,
        wants_usage=wants_usage,
        # `n` / `best_of`: one engine sequence each, so one request may hold several slots
        sequences=max(
            _bounded(payload, "n", max_n, "limits.max_n") or 1,
            _bounded(payload, "best_of", max_n, "limits.max_n") or 1,
        ),
        prompt_tokens=max(1, len(body) // BYTES_PER_TOKEN),
        caps_output=any(payload.get(name) is not None for name in _TOKEN_LIMITS),
    )


def response_format(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer format a body asks for: chat's `response_format` or the Responses API's
    `text.format`, if an object."""
    fmt = payload.get("response_format")
    if not isinstance(fmt, dict):
        text = payload.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
    return fmt if isinstance(fmt, dict) else None


def format_schema(fmt: Mapping[str, Any]) -> dict[str, Any] | None:
    """A `json_schema` format's JSON Schema (chat nests it under `json_schema`, the Responses API
    does not), if an object."""
    spec = fmt.get("json_schema", fmt)
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return schema if isinstance(schema, dict) else None


def output_limit(payload: Mapping[str, Any]) -> int | None:
    """The answer's token limit a body sets (`max_completion_tokens`, `max_tokens` or the
    Responses API's `max_output_tokens`, first found), if a positive integer."""
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _check_token_limits(payload: dict[str, Any], ceiling: int) -> None:
    for name in _TOKEN_LIMITS:
        _bounded(payload, name, ceiling)


def _bounded(payload: dict[str, Any], name: str, ceiling: int, limit: str = "") -> int | None:
    """`payload[name]` if absent (None) or an integer from 1 to `ceiling`; else 400."""
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
        named = f" ({limit})" if limit else ""
        raise InvalidRequest(f"'{name}' must be an integer from 1 to {ceiling}{named}", param=name)
    return value


def model_renamer(upstream: str, requested: str) -> Callable[[bytes], bytes] | None:
    """A rewrite of an answer's `"model": "<upstream id>"` fields to the requested name, on
    the bytes (no re-encoding: a stream's events are rewritten as they pass); None when the
    names are the same. Compact and `": "`-spaced JSON are both rewritten."""
    if upstream == requested:
        return None
    old, new = orjson.dumps(upstream), orjson.dumps(requested)
    compact, spaced = b'"model":' + old, b'"model": ' + old
    to_compact, to_spaced = b'"model":' + new, b'"model": ' + new

    def rename(data: bytes) -> bytes:
        if compact in data:
            data = data.replace(compact, to_compact)
        if spaced in data:
            data = data.replace(spaced, to_spaced)
        return data

    return rename


def upstream_body(request: RequestPeek, upstream_model: str, *, ask_usage: bool) -> bytes:
    """The body to send upstream: the client's, with the model id rewritten and, for a
    chat/completions stream, usage requested so token counts are known."""
    payload = dict(request.payload)
    payload["model"] = upstream_model
    if ask_usage and request.stream and not request.wants_usage:
        options = payload.get("stream_options")
        merged = dict(options) if isinstance(options, dict) else {}
        merged["include_usage"] = True
        payload["stream_options"] = merged
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:  # e.g. nested deeper than the encoder allows
        raise InvalidRequest(f"request body cannot be forwarded: {exc}") from exc
