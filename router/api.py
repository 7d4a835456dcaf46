"""The OpenAI-compatible routes and health checks. Thin: read, hand to dispatch, shape.

The proxied routes are plain Starlette endpoints (no FastAPI dependency solving on the hot
path); the body is read once, with the configured size limit enforced while reading.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from router.auth import ApiKeys
from router.config import GatewayConfig
from router.disconnect import unless_client_leaves
from router.dispatch import Dispatcher, Reply
from router.errors import InvalidRequest, PayloadTooLarge
from router.state.base import StateStore

PROXIED_PATHS = ("/chat/completions", "/completions", "/embeddings", "/responses")
_JSON = "application/json"


class _CleanupAfterSend(Response):
    """Runs the reply's cleanup (release the slot, record) after the response is sent, however
    it ends: finished, failed, client gone (Starlette cancels the body on disconnect), or never
    started. Cleanup is shielded from that cancellation so a slot is always released, and it
    is off the client's critical path: the answer is out before the store round trip."""

    _on_close: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                with anyio.CancelScope(shield=True):
                    await self._on_close()


class RelayResponse(_CleanupAfterSend, StreamingResponse):
    def __init__(self, reply: Reply) -> None:
        assert reply.stream is not None
        super().__init__(
            reply.stream, status_code=reply.status, headers=reply.headers, media_type="text/event-stream"
        )
        self._on_close = reply.on_close


class BodyResponse(_CleanupAfterSend):
    def __init__(self, reply: Reply) -> None:
        super().__init__(
            reply.body,
            status_code=reply.status,
            headers=reply.headers,
            media_type=reply.headers.get("content-type", _JSON),
        )
        self._on_close = reply.on_close


def proxied_route(path: str, dispatcher: Dispatcher, keys: ApiKeys, max_body: int) -> Route:
    async def endpoint(request: Request) -> Response:
        received_at = time.monotonic()
        keys.check(request)
        body = await read_body(request, max_body)
        reply = await unless_client_leaves(
            request.receive, dispatcher.dispatch(path, body, request.scope["headers"], received_at)
        )
        if reply is None:  # the client is gone: nobody to answer
            return Response(status_code=499)
        if reply.stream is not None:
            return RelayResponse(reply)
        return BodyResponse(reply)

    return Route("/v1" + path, endpoint, methods=["POST"])


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than `limit` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("invalid Content-Length header")
        if int(declared) > limit:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise InvalidRequest("the client closed the connection while sending the body") from exc
    return b"".join(chunks)


def models_route(config: GatewayConfig) -> Route:
    created = int(time.time())
    listing = orjson.dumps(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": "tidegate"}
                for name in config.models
            ],
        }
    )

    async def endpoint(request: Request) -> Response:
        return Response(listing, media_type=_JSON)

    return Route("/v1/models", endpoint, methods=["GET"])


def health_routes(store: StateStore) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    async def readyz(request: Request) -> Response:
        """Ready while the gateway can serve, which it can without Redis (decisions are then
        local): an unreachable store is reported as `degraded`, still 200, so an orchestrator
        does not take every replica out of service because Redis blinked."""
        reachable = await _ping(store)
        body = {
            "status": "ready" if reachable and not store.degraded else "degraded",
            "state_store": store.name,
            "state_store_reachable": reachable,
            "fallback_admissions": store.fallback_admissions,
        }
        return Response(orjson.dumps(body), media_type=_JSON)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]


def metrics_route(registry: CollectorRegistry) -> Route:
    """Prometheus text exposition of this process's registry (see router/telemetry.py)."""

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", metrics, methods=["GET"])


async def _ping(store: StateStore) -> bool:
    with anyio.move_on_after(2.0):
        return await store.ping()
    return False
