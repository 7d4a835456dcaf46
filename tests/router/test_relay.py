"""SSE relaying: framing kept, TTFT found, the injected usage chunk dropped."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from router.errors import UpstreamTimeout
from router.request.relay import SseRelay, StreamResult, first_events, relay_stream


def chunk(content: str | None, *, usage: dict[str, int] | None = None, choices: bool = True) -> bytes:
    body: dict[str, object] = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}}] if choices else [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


STREAM = (
    chunk("")
    + chunk("Hel")
    + chunk("lo")
    + chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 2}, choices=False)
    + b"data: [DONE]\n\n"
)


def relay_all(pieces: list[bytes], *, drop_usage: bool) -> tuple[bytes, StreamResult]:
    result = StreamResult()
    relay = SseRelay(result, drop_usage=drop_usage)
    out = b"".join(relay.feed(p) for p in pieces) + relay.flush()
    return out, result


@pytest.mark.parametrize("size", [1, 3, 7, 64, len(STREAM)])
def test_any_chunking_gives_the_same_events(size):
    pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    out, result = relay_all(pieces, drop_usage=False)
    assert out == STREAM
    assert result.usage is not None and result.usage.output_tokens == 2
    assert result.completed and result.first_token_at is not None


def test_usage_chunk_is_dropped_when_the_client_did_not_ask():
    out, result = relay_all([STREAM], drop_usage=True)
    assert out == STREAM.replace(
        chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 2}, choices=False), b""
    )
    assert result.usage is not None and result.usage.input_tokens == 3


def test_first_token_is_the_first_event_with_content_not_the_role_chunk():
    result = StreamResult()
    relay = SseRelay(result, drop_usage=False)
    relay.feed(chunk(""))
    assert result.first_token_at is None
    relay.feed(chunk("x"))
    assert result.first_token_at is not None


def test_crlf_framing_is_normalised():
    out, result = relay_all([STREAM.replace(b"\n", b"\r\n")], drop_usage=False)
    assert out == STREAM and result.completed


def test_failure_after_first_byte_becomes_an_error_event():
    async def upstream():
        yield chunk("a")
        raise UpstreamTimeout("ded: timed out")

    async def run() -> tuple[list[bytes], StreamResult]:
        result = StreamResult()
        out = [
            b
            async for b in relay_stream(SseRelay(result, drop_usage=True), b"", upstream(), expect_done=True)
        ]
        return out, result

    out, result = asyncio.run(run())
    assert out[0] == chunk("a")
    assert out[1].startswith(b"event: error\ndata: ")
    error = orjson.loads(out[1].split(b"data: ", 1)[1])["error"]
    assert error["code"] == "upstream_timeout" and "stream interrupted" in error["message"]
    assert isinstance(result.error, UpstreamTimeout)


def test_stream_closed_without_done_is_reported_as_cut():
    async def upstream():
        yield chunk("a")

    async def run() -> list[bytes]:
        return [
            b
            async for b in relay_stream(
                SseRelay(StreamResult(), drop_usage=True), b"", upstream(), expect_done=True
            )
        ]

    assert asyncio.run(run())[-1].startswith(b"event: error")


def test_a_first_event_framed_before_the_answer_started_is_timed_when_relayed():
    """TTFT is "first output relayed": framing the first events early (to fail over before
    the client sees anything) must not move it earlier."""

    async def run() -> tuple[float, StreamResult]:
        async def upstream():
            yield chunk("a")
            yield b"data: [DONE]\n\n"

        result = StreamResult()
        relay = SseRelay(result, drop_usage=False)
        chunks = upstream()
        first = await first_events(relay, chunks)
        assert result.first_token_at is not None  # seen while framing ...
        before_relaying = time.monotonic()
        out = [b async for b in relay_stream(relay, first, chunks, expect_done=True)]
        assert out[0] == chunk("a") and result.completed
        return before_relaying, result

    before_relaying, result = asyncio.run(run())
    assert (
        result.first_token_at is not None and result.first_token_at >= before_relaying
    )  # ... timed when relayed


def test_a_chunk_of_many_events_counts_and_finds_the_same_as_one_event_at_a_time(monkeypatch):
    """An upstream that writes a whole answer at once: after the first token only the events
    with a usage object or a finish_reason are parsed, and the counts stay those of events
    relayed one at a time."""
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    usage = chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 18}, choices=False)
    stream = chunk("") + b"".join(chunk(f"t{i}") for i in range(18)) + finish + usage + b"data: [DONE]\n\n"
    one_at_a_time_out, one_at_a_time = relay_all(
        [e + b"\n\n" for e in stream.split(b"\n\n")[:-1]], drop_usage=False
    )
    parsed: list[bytes] = []
    loads = orjson.loads
    monkeypatch.setattr("router.request.relay.orjson.loads", lambda data: parsed.append(data) or loads(data))
    out, at_once = relay_all([stream], drop_usage=False)
    assert out == one_at_a_time_out == stream
    assert at_once.output_events == one_at_a_time.output_events == 18
    assert at_once.usage is not None and at_once.usage.output_tokens == 18
    assert at_once.completed and at_once.first_token_at is not None
    assert at_once.shape == one_at_a_time.shape  # the finish_reason was seen
    assert len(parsed) == 4  # the role chunk, the first token, the finish, the usage
