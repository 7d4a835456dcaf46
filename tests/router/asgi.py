"""The fast tier's harness: the whole gateway app in-process over `httpx.ASGITransport`, its
upstreams as `httpx.MockTransport` handlers (the pattern httpx's own tests use). No socket,
no thread, no subprocess: for what does not need a real connection. The real-part
acceptance tests live in tests/integration/."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from fastapi import FastAPI

from router.app import create_app
from router.config import Endpoint, parse_config
from router.record.records import Recorder, RequestRecord
from router.record.telemetry import Telemetry

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def chat_reply(text: str = "hello", model: str = "up") -> httpx.Response:
    body = {
        "id": "c1",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    return httpx.Response(200, json=body)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _event({"id": "c1", "object": "chat.completion.chunk", "model": "up", "choices": [choice]})


def stream_reply(*texts: str) -> httpx.Response:
    events = [chunk(t) for t in texts] + [chunk(finish="stop"), b"data: [DONE]\n\n"]
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(events))


class _CutStream(httpx.AsyncByteStream):
    """Some events, then the connection drops."""

    def __init__(self, events: Iterable[bytes]) -> None:
        self._events = list(events)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self._events:
            yield event
        raise httpx.ReadError("connection reset by peer")


def cut_stream_reply(*texts: str) -> Callable[[], httpx.Response]:
    """A stream whose connection drops after `texts` (built anew for each request)."""
    return lambda: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=_CutStream(chunk(t) for t in texts)
    )


def error_reply(
    status: int, message: str = "upstream says no", headers: dict[str, str] | None = None
) -> httpx.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return httpx.Response(status, json=body, headers=headers)


@dataclass
class MockUpstreams:
    """Each endpoint (by name) answers with its handler; every request it got is kept."""

    handlers: dict[str, Handler]
    seen: list[tuple[str, httpx.Request]] = field(default_factory=list)

    def transport(self, endpoint: Endpoint) -> httpx.AsyncBaseTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            await request.aread()
            self.seen.append((endpoint.name, request))
            return await self.handlers[endpoint.name](request)

        return httpx.MockTransport(handle)

    def calls(self, name: str) -> int:
        return sum(1 for seen, _ in self.seen if seen == name)


Reply = httpx.Response | Exception | Callable[[], httpx.Response]


def answers(*replies: Reply) -> Handler:
    """A handler that gives `replies` in turn, then repeats the last one. A response is
    answered as a fresh, unread copy each time; a callable builds one (for streams that
    can only be read once)."""
    queue = list(replies)

    async def handle(request: httpx.Request) -> httpx.Response:
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, httpx.Response):  # as a transport gives it: not read yet
            return httpx.Response(
                reply.status_code, headers=reply.headers, stream=httpx.ByteStream(reply.content)
            )
        return reply()

    return handle


class Outcomes:
    """A recorder sink: every request's record, in order."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(self, outcome: RequestRecord) -> None:
        self.records.append(outcome)

    @property
    def last(self) -> RequestRecord:
        return self.records[-1]


@dataclass
class Gateway:
    client: httpx.AsyncClient
    app: FastAPI
    outcomes: Outcomes

    async def chat(self, stream: bool = False, **extra: Any) -> httpx.Response:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}
        return await self.client.post("/v1/chat/completions", json=body)

    @property
    def in_flight(self) -> int:
        return sum(self.app.state.store.snapshot().in_flight.values())


MODEL_YAML = """
auth: {{api_keys: [key]}}
models:
  m:
    retry: {{attempts: {attempts}, backoff_ms: 1{retry}}}
    canary_percent: {canary}
{endpoints}
"""
TIMEOUTS = "timeouts: {connect_s: 1, ttft_s: 0.2, idle_s: 1, total_s: 5}"


def model_yaml(
    dedicated: Iterable[str] = ("ded",),
    serverless: Iterable[str] = ("sl1", "sl2"),
    *,
    attempts: int = 3,
    canary: float = 100,
    capacity: int = 2,
    retry: str = "",
) -> str:
    """One model `m` with dedicated and serverless endpoints at `http://NAME.test/v1`;
    `retry` adds settings to its retry mapping."""
    lines = []
    dedicated, serverless = list(dedicated), list(serverless)
    if dedicated:
        lines.append("    dedicated:")
        lines += [
            f"      - {{name: {n}, gpu_hour_usd: 0, base_url: 'http://{n}.test/v1', model: up, max_concurrency: {capacity}, {TIMEOUTS}}}"
            for n in dedicated
        ]
    if serverless:
        lines.append("    serverless:")
        lines += [
            f"      - {{name: {n}, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://{n}.test/v1', model: up, api_key: 'prov-{n}', {TIMEOUTS}}}"
            for n in serverless
        ]
    more = f", {retry}" if retry else ""
    return MODEL_YAML.format(attempts=attempts, canary=canary, retry=more, endpoints="\n".join(lines))


@contextlib.asynccontextmanager
async def asgi_gateway(yaml_text: str, upstreams: MockUpstreams) -> AsyncIterator[Gateway]:
    outcomes, telemetry = Outcomes(), Telemetry()
    recorder = Recorder(sinks=[telemetry, outcomes])  # as the app's own, plus ours
    config = parse_config(yaml_text, {})
    app = create_app(config, transport=upstreams.transport, recorder=recorder, telemetry=telemetry)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 50000))
        headers = {"authorization": "Bearer key"}
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers) as client:
            yield Gateway(client, app, outcomes)
