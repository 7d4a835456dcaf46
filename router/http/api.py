"""The OpenAI-compatible routes and health checks. Thin: read, hand to dispatch, shape.

The proxied routes are served by `LeanApi`, straight from ASGI ahead of FastAPI's middleware
stack (which the admin, models and health routes keep): one error renderer, no dependency
solving, no exception, telemetry or body-limit middleware on the hot path. The body is read
once, with the configured size limit enforced while reading.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import anyio
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.config import GatewayConfig, LimitsConfig
from router.errors import (
    INTERNAL_ERROR_MESSAGE,
    ClientTooSlow,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    ServerStopping,
)
from router.http.auth import ApiKeys
from router.http.disconnect import unless_client_leaves
from router.openai import PATHS
from router.request.dispatch import Dispatcher, Reply, new_request_id
from router.request.job import Client
from router.state.roles import StateStore

PROXIED_PATHS = tuple(PATHS)
log = logging.getLogger("tidegate")
_JSON = "application/json"


class _ClientStalled(Exception):
    """The client read nothing for `client_write_timeout_s`."""


class _CleanupAfterSend(Response):
    """Sends a Reply within its limits and runs its cleanup (release the slot, record) after,
    however sending ends: finished, failed, client gone (Starlette cancels the body on
    disconnect), cut (see `_send_bounded`), or never started. Cleanup is shielded from
    cancellation so a slot is always released, and it is off the client's critical path:
    the answer is out before the store round trip."""

    _reply: Reply
    _write_timeout_s: float

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._send_bounded(scope, receive, send)
        finally:
            if self._reply.on_close is not None:
                with anyio.CancelScope(shield=True):
                    await self._reply.on_close()

    async def _deliver(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    async def _send_bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A client that stops reading holds a slot only for `client_write_timeout_s` per
        write: then the response is cut (the connection closed) and the stream's result says
        why. (The request's deadline ends a stream cleanly: see `Upstream.chunks`.)"""
        write_timeout = self._write_timeout_s

        async def bounded_send(message: Message) -> None:
            try:
                async with asyncio.timeout(write_timeout):
                    await send(message)
            except TimeoutError:
                raise _ClientStalled from None  # not an OSError, which Starlette takes for a disconnect

        try:
            await self._deliver(scope, receive, bounded_send)
        except* _ClientStalled:
            if self._reply.result is not None:
                self._reply.result.cut = "client_write_timeout"
            log.warning("response cut: the client read nothing for %gs: %s", write_timeout, scope["path"])


class RelayResponse(_CleanupAfterSend, StreamingResponse):
    """Relays a stream until it ends or the client leaves. The client is watched by one asyncio
    task (`unless_client_leaves`), not Starlette's anyio task group, which cost a tenth of a
    stream's CPU in the gateway (issue 13); uvicorn's `send` to a gone client is a silent
    no-op, so without a watcher a stream would run on to its end."""

    def __init__(self, reply: Reply, write_timeout_s: float) -> None:
        assert reply.stream is not None
        super().__init__(
            reply.stream, status_code=reply.status, headers=reply.headers, media_type="text/event-stream"
        )
        self._reply = reply
        self._write_timeout_s = write_timeout_s

    async def _deliver(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_client_leaves(receive, self.stream_response(send))
        except asyncio.CancelledError:  # not the client leaving: the server stops (drain over)
            await self._say_stopping(send)
            raise

    async def _say_stopping(self, send: Send) -> None:
        """End the stream with an error event before the connection is closed under it."""
        reply = self._reply
        if reply.result is not None:
            reply.result.cut = "server_stopping"
        if reply.error_event is None:
            return
        event = reply.error_event(ServerStopping("the gateway is shutting down; retry the request"))
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await send({"type": "http.response.body", "body": event, "more_body": True})


class BodyResponse(_CleanupAfterSend):
    def __init__(self, reply: Reply, write_timeout_s: float) -> None:
        super().__init__(
            reply.body,
            status_code=reply.status,
            headers=reply.headers,
            media_type=reply.headers.get("content-type", _JSON),
        )
        self._reply = reply
        self._write_timeout_s = write_timeout_s


Endpoint = Callable[[Request], Awaitable[Response]]


class LeanApi:
    """POSTs to the proxied paths go to their endpoints here; everything else (and every other
    method on those paths, for FastAPI's 405) to `app`. A GatewayError becomes its OpenAI
    error; anything else is logged and answered as a 500 `api_error`."""

    def __init__(self, app: ASGIApp, endpoints: Mapping[str, Endpoint]) -> None:
        self._app = app
        self._endpoints = dict(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except GatewayError as exc:
            response = error_response(exc)
        except Exception:
            log.exception("unhandled error on POST %s", scope["path"])
            response = error_response(GatewayError(INTERNAL_ERROR_MESSAGE))
        await response(scope, receive, send)


def error_response(exc: GatewayError) -> Response:
    """A GatewayError as the OpenAI-shaped error the client gets (the lean path and FastAPI's
    handlers both answer with this), with its Retry-After when it has one."""
    headers = {"x-request-id": new_request_id()}  # the SDKs' `request_id`, on refusals too
    if exc.retry_after_s is not None:
        headers["retry-after"] = f"{exc.retry_after_s:g}"
    return Response(exc.body(), status_code=exc.status_code, media_type=_JSON, headers=headers)


def proxied_endpoint(path: str, dispatcher: Dispatcher, keys: ApiKeys, limits: LimitsConfig) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        received_at = time.monotonic()
        caller = keys.check(request)
        body = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
        peer = request.scope.get("client")
        client = Client(peer[0] if peer else None, caller)
        work = dispatcher.dispatch(path, body, request.scope["headers"], received_at, client)
        reply = await unless_client_leaves(request.receive, work)
        if reply is None:  # the client is gone: nobody to answer
            return Response(status_code=499)
        return await respond(reply, limits.client_write_timeout_s)

    return endpoint


async def respond(reply: Reply, write_timeout_s: float) -> Response:
    """The Response for a Reply; if it cannot even be built, the Reply's cleanup still runs."""
    try:
        if reply.stream is not None:
            return RelayResponse(reply, write_timeout_s)
        return BodyResponse(reply, write_timeout_s)
    except BaseException:
        if reply.on_close is not None:
            with anyio.CancelScope(shield=True):
                await reply.on_close()
        raise


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body within `timeout_s` (else 408), refusing more than `limit` bytes (413)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit)
    except TimeoutError:
        raise ClientTooSlow(
            f"the request body did not arrive within limits.body_timeout_s ({timeout_s:g}s)"
        ) from None


async def _read_body(request: Request, limit: int) -> bytes:
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


def models_routes(config: GatewayConfig, keys: ApiKeys) -> list[Route]:
    """`GET /v1/models` and `GET /v1/models/{id}`: the configured model names, behind the
    client keys like every other `/v1` route (tools check a key by listing models)."""
    created = int(time.time())
    objects = {
        name: orjson.dumps({"id": name, "object": "model", "created": created, "owned_by": "tidegate"})
        for name in config.models
    }
    listing = b'{"object":"list","data":[' + b",".join(objects.values()) + b"]}"

    async def list_models(request: Request) -> Response:
        keys.check(request)
        return Response(listing, media_type=_JSON)

    async def retrieve_model(request: Request) -> Response:
        keys.check(request)
        name = request.path_params["model"]
        found = objects.get(name)
        if found is None:
            raise ModelNotFound(f"The model `{name}` does not exist", param="model")
        return Response(found, media_type=_JSON)

    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    ]


def health_routes(store: StateStore, time_scale: float = 1.0) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    async def readyz(request: Request) -> Response:
        """Ready while the gateway can serve, which it can without Redis (decisions are then
        local): an unreachable store is reported as `degraded`, still 200, so an orchestrator
        does not take every replica out of service because Redis blinked. Served from what the
        store's background refresh last saw: no I/O, whoever asks and however often."""
        reachable = not store.degraded
        body = {
            "status": "ready" if reachable and not store.degraded else "degraded",
            "state_store": store.name,
            "state_store_reachable": reachable,
            "fallback_admissions": store.fallback_admissions,
            "time_scale": time_scale,  # not 1: a time-lapsed gateway, for `tidegate replay --speed`
        }
        return Response(orjson.dumps(body), media_type=_JSON)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]


def metrics_route(registry: CollectorRegistry) -> Route:
    """Prometheus text exposition of this process's registry (see router/record/telemetry.py)."""

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", metrics, methods=["GET"])
