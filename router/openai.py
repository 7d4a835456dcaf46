"""Peek at an OpenAI request body without modelling it, and rewrite what must change.

The hot path scans the JSON once (msgspec): the top level is split into its fields, each kept
as the client's own bytes; only the few small fields routing reads are parsed (`model`,
`stream`, `user`, `stream_options`, the token limits, `n`, the answer format). What goes
upstream is the same fields verbatim with the upstream's model id (`UpstreamBody`), so a body
costs its size in memory, never the 25x of its values parsed into objects (issue 35). No schema
validation of whole chat requests: the upstream does that and its error is relayed to the
client. The few fields the gateway itself relies on, or that would make an upstream burn
capacity for nothing (an absurd output-token limit), are checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import msgspec
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
class AnswerFormat:
    """The answer format a request asks for, as the success checks read it: JSON (`json_object`
    or `json_schema`), with the schema's JSON text when it gave one that fits the bound the
    gateway checks answers against (`schema_skipped` when it gave a larger one)."""

    schema: bytes | None = None
    schema_skipped: bool = False


@dataclass(frozen=True, slots=True)
class RequestPeek:
    """What routing, admission and the success checks need from a request body. The body itself
    is not kept parsed: `body` is what goes upstream (router/openai.py UpstreamBody)."""

    body: UpstreamBody
    model: str
    stream: bool
    user: str | None
    wants_usage: bool
    sequences: int = 1  # what the engine generates at once: max(n, best_of)
    prompt_tokens: int = 1  # a fast estimate (body bytes / 4) for predicted-TTFT admission
    caps_output: bool = False  # the client set max_tokens / max_completion_tokens / max_output_tokens
    output_limit: int | None = None  # that limit, when set
    answer_format: AnswerFormat | None = None  # the client asked for a JSON answer
    tools: bool = False  # the client offered tools (their calls' arguments are checked)

    @property
    def wants_checks(self) -> bool:
        """Whether an answer's text must be gathered for the JSON checks."""
        return self.tools or self.answer_format is not None


BYTES_PER_TOKEN = 4  # an English-text rule of thumb; the prefill model learns in these units
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_SCHEMA_BYTES = 65536  # a larger response_format schema is not checked (docs/security.md)
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ENCODE = msgspec.json.Encoder()


class UpstreamBody:
    """The client's body as it goes upstream: its top-level fields as the client wrote them
    (verbatim bytes, never parsed into objects), `model` first with the upstream's id. One
    encoding is held at a time; another upstream id is a copy with only the `model` prefix
    changed, which replaces it (the attempt that sent the old one keeps its own reference). So a
    request holds one copy of its body, two while a hedge races (docs/security.md)."""

    __slots__ = ("_body", "_model", "_prefix")

    def __init__(self, fields: dict[str, msgspec.Raw], model: str) -> None:
        name = _ENCODE.encode(model)
        self._model = model
        self._prefix = b'{"model":' + name
        # one pass: the model first, then the client's other fields verbatim, in its order
        self._body = _ENCODE.encode({"model": msgspec.Raw(name), **fields})

    def __len__(self) -> int:
        return len(self._body)

    def for_model(self, model: str) -> bytes:
        """The body with `model` as its model id."""
        if model == self._model:
            return self._body
        prefix = b'{"model":' + _ENCODE.encode(model)
        if prefix != self._prefix:
            self._body = b"".join((prefix, memoryview(self._body)[len(self._prefix) :]))
            self._prefix = prefix
        self._model = model
        return self._body

    def fields(self) -> dict[str, msgspec.Raw]:
        """The top-level fields again (a scan of the body, no values parsed)."""
        return _FIELDS.decode(self._body)


def json_object(body: bytes, what: str = "request body") -> dict[str, Any]:
    """`body` parsed as a JSON object; InvalidRequest (400) for anything else."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return payload


def peek(
    body: bytes, max_output_tokens: int = 1 << 20, max_n: int = 8, *, ask_usage: bool = False
) -> RequestPeek:
    """Read a JSON request body's top level without parsing its values (messages, tools and
    every field routing does not read stay bytes); raise InvalidRequest for anything routing
    cannot use. `ask_usage`: a stream asks its upstream for usage (chat and completions)."""
    fields = _top_level(body)
    model = _value(fields, "model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("you must provide a model parameter", param="model")
    stream = _value(fields, "stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    user = _value(fields, "user") if "user" in fields else None  # absent fields cost no call
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("'user' must be a string", param="user")
    options = _object(fields, "stream_options")
    limits = [_bounded(fields, name, max_output_tokens) for name in _TOKEN_LIMITS if name in fields]
    output_limit = next((limit for limit in limits if limit is not None), None)
    sequences = 1
    for name in ("n", "best_of"):
        if name in fields:
            sequences = max(sequences, _bounded(fields, name, max_n, "limits.max_n") or 1)
    wants_usage = options is not None and _value(options, "include_usage") is True
    if ask_usage and stream and not wants_usage:
        merged = dict(options or {})
        merged["include_usage"] = msgspec.Raw(b"true")
        fields["stream_options"] = msgspec.Raw(_ENCODE.encode(merged))
    del fields["model"]
    return RequestPeek(
        body=UpstreamBody(fields, model),
        model=model,
        stream=bool(stream),
        user=user,
        wants_usage=wants_usage,
        sequences=sequences,
        prompt_tokens=max(1, len(body) // BYTES_PER_TOKEN),
        caps_output=output_limit is not None,
        output_limit=output_limit,
        answer_format=_answer_format(fields),
        tools=_nonempty_array(fields.get("tools")),
    )


def _top_level(body: bytes) -> dict[str, msgspec.Raw]:
    try:
        return _FIELDS.decode(body)
    except msgspec.ValidationError as exc:
        raise InvalidRequest("request body must be a JSON object") from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidRequest("request body is nested too deeply to be read") from exc


def _value(fields: Mapping[str, msgspec.Raw], name: str) -> Any:
    """One top-level field parsed (None when absent). Called only for the few small fields the
    gateway reads; 400 naming the field when it is not valid JSON."""
    raw = fields.get(name)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidRequest(f"'{name}' could not be read: {exc}", param=name) from exc


def _object(fields: Mapping[str, msgspec.Raw], name: str, param: str = "") -> dict[str, msgspec.Raw] | None:
    """A field that must be an object, its own fields unparsed (None when absent or null)."""
    raw = fields.get(name)
    if raw is None or bytes(raw) == b"null":
        return None
    try:
        return _FIELDS.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidRequest(f"'{param or name}' must be an object", param=param or name) from exc


def _answer_format(fields: Mapping[str, msgspec.Raw]) -> AnswerFormat | None:
    """Chat's `response_format` or the Responses API's `text.format`, when it asks for JSON.
    Malformed formats are the upstream's to refuse: here they ask for nothing."""
    try:
        fmt = _object(fields, "response_format")
        if fmt is None:
            text = _object(fields, "text")
            fmt = _object(text, "format") if text is not None else None
        kind = _value(fmt, "type") if fmt is not None else None
    except InvalidRequest:
        return None
    if kind == "json_object":
        return AnswerFormat()
    return _with_schema(fmt) if kind == "json_schema" and fmt is not None else None


def _with_schema(fmt: Mapping[str, msgspec.Raw]) -> AnswerFormat:
    """A `json_schema` format with its schema, unless that is over `MAX_SCHEMA_BYTES`. Chat
    nests the schema under `json_schema`, the Responses API does not."""
    try:
        spec = _object(fmt, "json_schema") if "json_schema" in fmt else fmt
    except InvalidRequest:
        return AnswerFormat()
    schema = spec.get("schema") if spec is not None else None
    if schema is None:
        return AnswerFormat()
    if len(schema) > MAX_SCHEMA_BYTES:
        return AnswerFormat(schema_skipped=True)
    return AnswerFormat(bytes(schema))


def _nonempty_array(raw: msgspec.Raw | None) -> bool:
    if raw is None:
        return False
    text = bytes(raw)
    return text[:1] == b"[" and text[1:].lstrip()[:1] != b"]"


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


def _bounded(fields: Mapping[str, msgspec.Raw], name: str, ceiling: int, limit: str = "") -> int | None:
    """The field if absent (None) or an integer from 1 to `ceiling`; else 400."""
    value = _value(fields, name)
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
