"""FastAPI's own errors (404, 405, a body its validation refused, anything unexpected) answered
in OpenAI's shape, like every GatewayError."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from router.errors import (
    INTERNAL_ERROR_MESSAGE,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
    error_body,
)
from router.http.answers import error_response

log = logging.getLogger("tidegate")


def install_error_handlers(app: FastAPI) -> None:
    async def gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error: GatewayError
        if exc.status_code == 405:
            error = MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}")
        elif exc.status_code == 404:
            error = RouteNotFound(f"Unknown request URL: {request.method} {request.url.path}")
        else:
            return Response(
                error_body(str(exc.detail), "invalid_request_error", None, None),
                status_code=exc.status_code,
                media_type="application/json",
            )
        return await gateway_error(request, error)

    async def invalid_body(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request"}
        return await gateway_error(request, InvalidRequest(f"invalid request body: {first['msg']}"))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(GatewayError(INTERNAL_ERROR_MESSAGE))

    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(Exception, unexpected)
