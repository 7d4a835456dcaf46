"""The gateway's errors, each rendered as an OpenAI-shaped error body.

    GatewayError                      500 api_error
    ├── ClientError                   4xx invalid_request_error (the client can fix it)
    │   ├── InvalidRequest            400
    │   ├── Unauthorized              401 invalid_api_key
    │   ├── ModelNotFound             404 model_not_found
    │   ├── RouteNotFound             404 unknown_url
    │   ├── MethodNotAllowed          405
    │   ├── ClientTooSlow             408 (headers or body later than limits.*_timeout_s)
    │   ├── PayloadTooLarge           413
    │   ├── PermissionDenied          403 permission_denied (a key's models, another caller's task)
    │   ├── RateLimited               429 rate_limit_exceeded (a key's rpm/tpm, early feedback)
    │   ├── InsufficientQuota         429 insufficient_quota (a key's budget is spent)
    │   └── HeadersTooLarge           431 (limits.max_header_bytes)
    ├── Overloaded                    503 server_overloaded (limits.max_in_flight / max_connections)
    ├── ServerStopping                503 server_stopping (a stream cut at the end of a drain)
    ├── RequestTimeout                504 request_timeout (limits.request_timeout_s passed)
    ├── StoreUnavailable              503 (an admin write could not reach the shared state store)
    └── UpstreamFailure               the request could not be served by an upstream
        ├── UpstreamUnreachable       502 (connect refused, reset, DNS)
        │   └── UpstreamStreamCut     502 upstream_stream_cut (a stream lost after its first byte)
        ├── UpstreamBadResponse       502 (malformed or oversized answer)
        ├── UpstreamMisconfigured     502 (the upstream answered 3xx/401/403/404/405/407)
        ├── UpstreamTimeout           504 (connect, first byte or idle gap)
        ├── UpstreamStatus            the upstream answered with an error status
        └── NoCapacity                503 (every target refused admission)

`message` is what the client reads; `detail` is what the operator reads in the access log
(it may name upstream hosts and library errors, which the client never sees).

Foreign exceptions (httpx, aiohttp, orjson, redis) are translated into these at exactly one
place each (`upstream.py`, `openai.py`, `state/redis.py`); the rest of the gateway only sees
this tree.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

INTERNAL_ERROR_MESSAGE = "The gateway hit an internal error."  # a bug of ours: the details go to the log


class GatewayError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "api_error"
    code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        detail: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.detail = detail or message
        self.headers = headers or {}  # sent with the error (a rate limit's x-ratelimit-* figures)

    @property
    def status_code(self) -> int:
        return self.status

    @property
    def retry_after_s(self) -> float | None:
        return None

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.param, self.code)


class ClientError(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class InvalidRequest(ClientError):
    pass


class Unauthorized(ClientError):
    status = 401
    code = "invalid_api_key"


class ModelNotFound(ClientError):
    status = 404
    code = "model_not_found"


class RouteNotFound(ClientError):
    status = 404
    code = "unknown_url"


class MethodNotAllowed(ClientError):
    status = 405
    code = "method_not_allowed"


class ClientTooSlow(ClientError):
    status = 408
    code = "request_timeout"


class PayloadTooLarge(ClientError):
    status = 413
    code = "request_too_large"


class RateLimited(ClientError):
    status = 429
    code = "rate_limit_exceeded"
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self._retry_after_s = retry_after_s

    @property
    def retry_after_s(self) -> float | None:
        return self._retry_after_s


class InsufficientQuota(ClientError):
    """A key's budget is spent: waiting a second will not help (the SDKs are told not to retry)."""

    status = 429
    code = "insufficient_quota"
    error_type = "insufficient_quota"


class PermissionDenied(ClientError):
    status = 403
    code = "permission_denied"


class HeadersTooLarge(ClientError):
    status = 431
    code = "headers_too_large"


class Overloaded(GatewayError):
    status = 503
    code = "server_overloaded"

    @property
    def retry_after_s(self) -> float | None:
        return 1.0


class ServerStopping(GatewayError):
    status = 503
    code = "server_stopping"


class RequestTimeout(GatewayError):
    status = 504
    code = "request_timeout"


REQUEST_TIMEOUT_MESSAGE = "the request did not complete within limits.request_timeout_s"


class StoreUnavailable(GatewayError):
    status = 503
    code = "state_store_unavailable"


class UpstreamFailure(GatewayError):
    """An attempt at one upstream failed. `is_retryable`: another attempt may help;
    `retry_same`: that attempt may go to the same endpoint (else only to another one);
    `blames_endpoint`: it counts against the endpoint's health (circuit breaker)."""

    retry_same: ClassVar[bool] = True

    @property
    def is_retryable(self) -> bool:
        return True

    @property
    def blames_endpoint(self) -> bool:
        return True


class UpstreamUnreachable(UpstreamFailure):
    status = 502
    code = "upstream_unreachable"


class UpstreamStreamCut(UpstreamUnreachable):
    """The upstream's stream ended or broke after the client got its first bytes: the
    answer is incomplete and cannot be retried."""

    code = "upstream_stream_cut"


class UpstreamBadResponse(UpstreamFailure):
    """A malformed answer (bad status line, oversized header, body or event)."""

    status = 502
    code = "upstream_bad_response"
    retry_same = False


class UpstreamMisconfigured(UpstreamFailure):
    """The upstream refused the gateway itself (credentials, path, redirect): the operator's
    problem, never the client's; the upstream's body is not relayed."""

    status = 502
    code = "upstream_misconfigured"
    retry_same = False


class UpstreamTimeout(UpstreamFailure):
    status = 504
    code = "upstream_timeout"


class NoCapacity(UpstreamFailure):
    status = 503
    code = "no_capacity"

    @property
    def blames_endpoint(self) -> bool:
        return False  # full is not broken


class UpstreamStatus(UpstreamFailure):
    """The upstream answered with a non-2xx status; its own error body is relayed as is."""

    _RETRYABLE_STATUSES: ClassVar[frozenset[int]] = frozenset({408, 429, 500, 502, 503, 504})

    def __init__(self, status: int, payload: bytes, retry_after_s: float | None) -> None:
        super().__init__(f"upstream answered {status}")
        self._status = status
        self._payload = payload
        self._retry_after_s = retry_after_s

    @property
    def status_code(self) -> int:
        return self._status

    @property
    def retry_after_s(self) -> float | None:
        return self._retry_after_s

    @property
    def is_retryable(self) -> bool:
        return self._status in self._RETRYABLE_STATUSES

    @property
    def blames_endpoint(self) -> bool:
        return self.is_retryable  # 408/429/5xx; a 400 is the request's fault

    def body(self) -> bytes:
        if _is_openai_error(self._payload):
            return self._payload
        return error_body(
            self.message,
            "api_error" if self._status >= 500 else "invalid_request_error",
            None,
            "upstream_error",
        )


def error_body(message: str, error_type: str, param: str | None, code: str | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


def _is_openai_error(payload: bytes) -> bool:
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)
