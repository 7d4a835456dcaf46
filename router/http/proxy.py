"""The proxied OpenAI routes. Thin: read, hand to dispatch, shape the answer.

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
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.config import LimitsConfig
from router.errors import INTERNAL_ERROR_MESSAGE, GatewayError, ServerStopping
from router.http.answers import JSON, error_response
from router.http.auth import ApiKeys
from router.http.bodies import read_body
from router.http.disconnect import unless_client_leaves
from router.openai import PATHS
from router.request.dispatch import Dispatcher
from router.request.job import Client
from router.request.quota import Quota
from router.request.reply import Reply, new_request_id

PROXIED_PATHS = tuple(PATHS)
log = logging.getLogger("tidegate")


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
            media_type=reply.headers.get("content-type", JSON),
        )
        self._reply = reply
        self._write_timeout_s = write_timeout_s


Endpoint = Callable[[Request, str], Awaitable[Response]]


class LeanApi:
    """POSTs to the proxied paths go to their endpoints here; everything else (and every other
    method on those paths, for FastAPI's 405) to `app`. Each proxied request gets its request
    id first, so every answer carries it, refusals too. A GatewayError becomes its OpenAI
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
        request_id = new_request_id()
        try:
            response = await endpoint(request, request_id)
        except GatewayError as exc:
            response = error_response(exc, request_id)
        except Exception:
            log.exception("unhandled error on POST %s", scope["path"])
            response = error_response(GatewayError(INTERNAL_ERROR_MESSAGE), request_id)
        await response(scope, receive, send)


def proxied_endpoint(
    path: str, dispatcher: Dispatcher, keys: ApiKeys, quota: Quota, limits: LimitsConfig
) -> Endpoint:
    async def endpoint(request: Request, request_id: str) -> Response:
        received_at = time.monotonic()
        caller = keys.check(request)
        # a named key's rate limits and budgets, before a byte of the body is read or parsed
        grant = await quota.admit(caller.key, declared_length(request), request_id)
        body = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
        peer = request.scope.get("client")
        client = Client(peer[0] if peer else None, caller.name, caller.key)
        work = dispatcher.dispatch(
            path, body, request.scope["headers"], received_at, client, request_id=request_id, grant=grant
        )
        del body  # the dispatcher drops it once peeked: the request holds one copy (docs/security.md)
        reply = await unless_client_leaves(request.receive, work)
        if reply is None:  # the client is gone: nobody to answer
            return Response(status_code=499)
        return await respond(reply, limits.client_write_timeout_s)

    return endpoint


def declared_length(request: Request) -> int:
    """The body's declared length (0 for a chunked body or none)."""
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() else 0


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
