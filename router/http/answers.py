"""The one way the HTTP layer turns a GatewayError into the OpenAI-shaped answer a client reads."""

from __future__ import annotations

from starlette.responses import Response

from router.errors import GatewayError
from router.request.reply import request_id_headers

JSON = "application/json"


def error_response(exc: GatewayError, request_id: str | None = None) -> Response:
    """A GatewayError as the OpenAI-shaped error the client gets (the lean path and FastAPI's
    handlers both answer with this), with its Retry-After when it has one, and its request id
    (the SDKs' `request_id`) as on every answer."""
    headers = request_id_headers(request_id)
    if exc.retry_after_s is not None:
        headers["retry-after"] = f"{exc.retry_after_s:g}"
    headers.update(exc.headers)
    return Response(exc.body(), status_code=exc.status_code, media_type=JSON, headers=headers)
