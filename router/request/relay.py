"""Relay an upstream answer to the client, measuring it on the way.

Streams are forwarded event by event as soon as each SSE event is complete (no re-framing
delay). Only the first events, until one carries output, are parsed as JSON (to time the
first token); after that an event is parsed only when it carries a usage object, which is
dropped again when the gateway asked for it and the client did not.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.errors import (
    GatewayError,
    UpstreamBadResponse,
    UpstreamStreamCut,
    UpstreamUnreachable,
    error_body,
)
from router.record.success import AnswerShape

log = logging.getLogger("tidegate")
_EVENT_END = b"\n\n"
_DONE = b"data: [DONE]"
_USAGE_OBJECT = b'"usage":{'
_USAGE_OBJECT_SPACED = b'"usage": {'
_FINISH = b'"finish_reason":"'  # a string: null in every chunk but the last
_FINISH_SPACED = b'"finish_reason": "'
_SEQUENCE = re.compile(rb'"sequence_number": ?(\d+)')


@dataclass(slots=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(slots=True)
class StreamResult:
    """Filled in while a stream is relayed; read once it ended (completed or not)."""

    first_token_at: float | None = None
    output_events: int = 0
    completed: bool = False  # the upstream sent [DONE] or closed cleanly after output
    error: GatewayError | None = None
    usage: Usage | None = None
    cut: str | None = None  # the HTTP layer cut the answer: client_write_timeout, server_stopping
    shape: AnswerShape = field(default_factory=AnswerShape)  # for router/record/success.py
    sequence_number: int = -1  # Responses streams: the last event's sequence_number
    response_id: str | None = None  # Responses streams: the id its response.created gave


class SseRelay:
    """Turns upstream byte chunks into complete SSE events for the client, in time linear in
    the bytes relayed (only new bytes are searched for an event's end); an event that grows
    past `max_event_bytes` without ending is UpstreamBadResponse. With `collect_bytes` > 0
    every event is parsed and the answer's text and tool-call arguments are kept (up to that
    many bytes) for the success checks; otherwise only events with a finish_reason are."""

    def __init__(
        self,
        result: StreamResult,
        *,
        drop_usage: bool,
        max_event_bytes: int = 8 << 20,
        rename: Callable[[bytes], bytes] | None = None,
        collect_bytes: int = 0,
        responses: bool = False,
    ) -> None:
        """`responses`: a Responses API stream, whose errors take that API's event shape."""
        self.result = result
        self._responses = responses
        self._collect = collect_bytes
        self._rename = rename
        self._drop_usage = drop_usage
        self._max_event = max_event_bytes
        self._buffer = bytearray()
        self._pending_cr = False

    def feed(self, chunk: bytes) -> bytes:
        """Bytes of the complete events in `buffer + chunk` to send now (maybe empty), with
        the answer's model renamed when the gateway was asked to."""
        return self._renamed(self._complete_events(chunk))

    def _complete_events(self, chunk: bytes) -> bytes:
        chunk = self._normalise(chunk)
        start = max(0, len(self._buffer) - 1)  # an event's end may straddle two chunks
        self._buffer += chunk
        end = self._buffer.rfind(_EVENT_END, start)
        if end < 0:
            self._check_size()
            return b""
        complete = bytes(self._buffer[: end + 2])
        del self._buffer[: end + 2]
        self._check_size()
        if self._responses:
            self._track_sequence(complete)
        if self._worth_parsing(complete):
            return self._inspect(complete)
        events = complete.count(_EVENT_END)
        if _DONE in complete:  # the end marker is not output
            self.result.completed = True
            events -= 1
        self.result.output_events += events
        return complete

    def _worth_parsing(self, events: bytes) -> bool:
        """Events are parsed until the first token, when the success checks collect the
        answer, and when they carry a usage object or a finish_reason; others only counted."""
        return (
            self.result.first_token_at is None
            or self._collect > 0
            or _USAGE_OBJECT in events
            or _USAGE_OBJECT_SPACED in events
            or _FINISH in events
            or _FINISH_SPACED in events
        )

    def flush(self) -> bytes:
        """What is left when the upstream closed: an unterminated last event, if any."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return self._renamed(self._inspect(rest + _EVENT_END) if rest.strip() else b"")

    def _track_sequence(self, events: bytes) -> None:
        found = _SEQUENCE.findall(events)
        if found:
            self.result.sequence_number = max(self.result.sequence_number, int(found[-1]))

    def error_event(self, exc: GatewayError) -> bytes:
        """The event that ends this stream on `exc`, in its API's shape: chat and completions
        streams get `event: error` with an OpenAI error object; Responses streams an `error`
        event and a `response.failed`, numbered after the last event relayed."""
        message = f"stream interrupted: {exc.message}"
        if not self._responses:
            return b"event: error\ndata: " + error_body(message, exc.error_type, None, exc.code) + _EVENT_END
        seq = self.result.sequence_number + 1
        code = exc.code or exc.error_type
        error = {"type": "error", "code": code, "message": message, "param": None, "sequence_number": seq}
        failed = {
            "type": "response.failed",
            "sequence_number": seq + 1,
            "response": {
                "id": self.result.response_id or "resp_unknown",
                "object": "response",
                "status": "failed",
                "error": {"code": code, "message": message},
                "incomplete_details": None,
                "output": [],
            },
        }
        self.result.sequence_number = seq + 1
        return _sse("error", error) + _sse("response.failed", failed)

    def _renamed(self, out: bytes) -> bytes:
        return self._rename(out) if self._rename is not None and out else out

    def _normalise(self, chunk: bytes) -> bytes:
        """CRLF line ends as LF, also when a CRLF is split between two chunks."""
        if self._pending_cr:
            chunk, self._pending_cr = b"\r" + chunk, False
        if chunk.endswith(b"\r"):
            chunk, self._pending_cr = chunk[:-1], True
        return chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk

    def _check_size(self) -> None:
        if len(self._buffer) > self._max_event:
            raise UpstreamBadResponse(
                "the upstream sent an oversized stream event",
                detail=f"an SSE event over limits.max_event_bytes ({self._max_event})",
            )

    def _inspect(self, complete: bytes) -> bytes:
        """Event by event; once the first token is in, the rest of a chunk's events are only
        parsed when worth it (an upstream that writes many events at once pays for one)."""
        kept: list[bytes] = []
        for event in complete.split(_EVENT_END)[:-1]:
            if self._worth_parsing(event):
                if not self._keep(event):
                    continue
            elif _DONE in event:
                self.result.completed = True
            else:
                self.result.output_events += 1
            kept.append(event + _EVENT_END)
        return b"".join(kept)

    def _keep(self, event: bytes) -> bool:
        data = _event_data(event)
        if data is None:
            return True
        if data == b"[DONE]":
            self.result.completed = True
            return True
        parsed = _loads(data)
        if self._responses and isinstance(parsed, dict) and parsed.get("type") == "response.created":
            response = parsed.get("response")
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                self.result.response_id = response["id"][:200]
        usage = _usage_of(parsed)
        if usage is not None:
            self.result.usage = usage
            if self._drop_usage and parsed.get("choices") == []:
                return False  # the usage-only chunk the client did not ask for
        if isinstance(parsed, dict):
            self.result.shape.take_choices(parsed.get("choices"), self._collect, collect=self._collect > 0)
        if _carries_output(parsed):
            self.result.output_events += 1
            if self.result.first_token_at is None:
                self.result.first_token_at = time.monotonic()
        return True


async def first_events(relay: SseRelay, chunks: AsyncIterator[bytes]) -> bytes:
    """Feed `relay` until it has whole events to send: the client bytes of the stream's first
    events, or what it held when the stream ended (b"" for an empty stream). The relay's own
    errors (an oversized event) are raised: nothing has reached the client yet."""
    async for chunk in chunks:
        out = relay.feed(chunk)
        if out:
            return out
    return relay.flush()


async def relay_stream(
    relay: SseRelay, first: bytes, chunks: AsyncIterator[bytes], *, expect_done: bool
) -> AsyncIterator[bytes]:
    """Yield `first` (see `first_events`), then the client bytes of the rest of `chunks`; on
    an upstream failure after the first byte, end the stream with an OpenAI-shaped error
    event instead of raising (a retry is impossible by then).

    `expect_done`: the protocol ends with `data: [DONE]` (chat and text completions), so a
    stream closed without it was cut short."""
    result = relay.result
    try:
        if first:
            if result.first_token_at is not None:
                # framed before the answer started: the first token is timed as it is relayed
                result.first_token_at = time.monotonic()
            yield first
        async for chunk in chunks:
            out = relay.feed(chunk)
            if out:
                yield out
        tail = relay.flush()
        if tail:
            yield tail
        if expect_done and not result.completed:
            raise UpstreamStreamCut("the upstream closed the stream before it finished")
        result.completed = True
    except GatewayError as exc:
        result.error = _as_cut(exc)
        yield relay.error_event(result.error)
    except Exception as exc:  # a bug of ours or an untranslated transport error: recorded, ended cleanly
        log.exception("stream relay failed")
        result.error = GatewayError("the gateway hit an internal error", detail=repr(exc))
        yield relay.error_event(result.error)


def _as_cut(exc: GatewayError) -> GatewayError:
    """A stream lost after its first byte (reset, refused, closed early) has one stable code."""
    if isinstance(exc, UpstreamUnreachable) and not isinstance(exc, UpstreamStreamCut):
        return UpstreamStreamCut("the upstream's stream was cut off", detail=exc.detail or exc.message)
    return exc


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + _EVENT_END


def parsed_body(body: bytes) -> Any:
    """A JSON answer parsed (None when it is not JSON)."""
    return _loads(body)


def usage_of(parsed: Any) -> Usage | None:
    """Usage from a parsed non-stream answer (chat, completions, embeddings, responses)."""
    return _usage_of(parsed)


def _event_data(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _choices_of(parsed: Any) -> list[Any]:
    choices = parsed.get("choices") if isinstance(parsed, dict) else None
    return choices if isinstance(choices, list) else []


def _usage_of(parsed: Any) -> Usage | None:
    if not isinstance(parsed, dict):
        return None
    usage = parsed.get("usage")
    if not isinstance(usage, dict) and isinstance(parsed.get("response"), dict):
        usage = parsed["response"].get("usage")  # responses API: response.completed event
    if not isinstance(usage, dict):
        return None
    inp = usage.get("prompt_tokens", usage.get("input_tokens"))
    out = usage.get("completion_tokens", usage.get("output_tokens"))
    return Usage(inp if isinstance(inp, int) else None, out if isinstance(out, int) else None)


def _carries_output(parsed: Any) -> bool:
    if not isinstance(parsed, dict):
        return False
    kind = parsed.get("type")
    if isinstance(kind, str):  # responses API events
        return kind.endswith(".delta")
    for choice in _choices_of(parsed):
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(
            delta.get(k) for k in ("content", "reasoning_content", "tool_calls", "refusal")
        ):
            return True
        if choice.get("text"):
            return True
    return False
