"""What the dispatcher hands the HTTP layer: a finished answer, a body or a stream."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from router.errors import GatewayError
from router.request.relay import StreamResult

REQUEST_ID_HEADER = "x-tidegate-request-id"


def new_request_id() -> str:
    """`req_` and 24 hex digits from `secrets`: feedback names requests by it, so unguessable."""
    return "req_" + secrets.token_hex(12)


def request_id_headers(request_id: str | None = None) -> dict[str, str]:
    """The request id as every answer carries it: `x-request-id` (what the OpenAI SDKs read as
    `request_id`) and `x-tidegate-request-id`, the same value; a new one when none is given."""
    found = request_id or new_request_id()
    return {"x-request-id": found, REQUEST_ID_HEADER: found}


@dataclass(slots=True)
class Reply:
    """A finished answer for the HTTP layer: a body, or a stream plus its cleanup. The HTTP
    layer runs `on_close` however sending ends; `result` (streams) is where it says why it
    cut the stream, if it did."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    on_close: Callable[[], Awaitable[None]] | None = None
    result: StreamResult | None = None
    # a hedge race's loser that answered too late: close and release, record nothing
    discard: Callable[[], Awaitable[None]] | None = None
    error_event: Callable[[GatewayError], bytes] | None = None  # how this stream says it failed
