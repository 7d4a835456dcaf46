"""Pooled HTTP calls to upstream endpoints; the only place httpx/aiohttp errors are seen.

One `httpx.AsyncClient` per endpoint, keep-alive pooled. The transport is a seam
(`TransportFactory`): the default is `httpx-aiohttp`, whose CPU cost per request is a
fraction of httpx's own transport (docs/benchmarks.md); tests may pass any
`httpx.AsyncBaseTransport`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from router.config import Endpoint
from router.errors import (
    REQUEST_TIMEOUT_MESSAGE,
    RequestTimeout,
    UpstreamBadResponse,
    UpstreamFailure,
    UpstreamMisconfigured,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from router.request.relay import SseRelay, first_events

log = logging.getLogger("tidegate.upstream")

TransportFactory = Callable[[Endpoint], httpx.AsyncBaseTransport]

# Never forwarded upstream: hop-by-hop (RFC 9110 §7.6.1), recomputed, or the client's secrets
# (the known credential headers of OpenAI, Azure, Anthropic, Google, AWS, and any header whose
# name says it carries a key, token, secret, password, credential, licence or anything of auth:
# `_CREDENTIAL`).
_DROP_REQUEST_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"authorization",
        b"accept-encoding",
        b"cookie",
        b"api-key",
        b"x-api-key",
        b"x-goog-api-key",
        b"ocp-apim-subscription-key",
        b"anthropic-api-key",
        b"x-amz-security-token",
        b"x-functions-key",
        b"private-token",
        b"set-cookie",
        # the client's word about where it came from is not ours to pass on (we add our own)
        b"forwarded",
        b"x-real-ip",
        # the provider's billing scope comes from the endpoint's config, never from a client
        b"openai-organization",
        b"openai-project",
    }
)
_CREDENTIAL = re.compile(  # by name: a key, token, secret, password, credential, licence or auth
    rb"api[-_]?key|secret|passw|credential|subscription-key|(^|-)token$|auth|(?<!^idempotency)(^|[-_])key$"
    rb"|access[-_]?key|licen[cs]e|signature"
)  # Idempotency-Key is the client's own, for the providers that honour it


@functools.lru_cache(maxsize=1024)  # bounded: a client can send any names; most repeat every request
def _names_a_credential(name: bytes) -> bool:
    """Whether a header of this name carries a secret (the search was ~1% of a request's
    instructions, once per header of every request)."""
    return _CREDENTIAL.search(name) is not None


_KEEP_RESPONSE_HEADERS = frozenset({"content-type", "x-request-id", "openai-processing-ms"})
_MAX_ERROR_BODY = 64 * 1024
_POOL_CONNECTIONS = 1024
# Every exception a transport may raise for a broken exchange: httpx's own tree, aiohttp's
# (httpx-aiohttp passes some through unmapped, e.g. a malformed status line or an oversized
# header), and the OS's. They are all translated here, so none reaches the dispatcher.
_TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError, OSError, asyncio.IncompleteReadError)
# The upstream refused the gateway itself: a redirect, bad credentials, a wrong path or model.
_MISCONFIGURED = frozenset({401, 403, 404, 405, 407})


def aiohttp_transport(endpoint: Endpoint) -> httpx.AsyncBaseTransport:
    """The default transport: aiohttp under httpx's API, one connection pool per endpoint."""
    limits = httpx.Limits(max_connections=_POOL_CONNECTIONS, keepalive_expiry=60.0)
    transport: httpx.AsyncBaseTransport = AiohttpTransport(limits=limits, trust_env=False)
    return transport


_MAX_URLS = 4096  # parsed URLs kept; replicas come and go, so the cache is bounded


class Upstream:
    """Opens requests to endpoints and maps every transport failure to `UpstreamFailure`.

    Requests go straight to each endpoint's transport, not through an `httpx.AsyncClient`:
    the gateway needs none of a client's cookies, auth flows, redirects or hooks, and a shared
    cookie jar would be worse than waste: state an upstream could grow without bound and would
    get back on every later request, whoever sent it."""

    def __init__(self, endpoints: Iterable[Endpoint], transport: TransportFactory) -> None:
        self._transports: dict[str, httpx.AsyncBaseTransport] = {}
        self._timeouts: dict[str, dict[str, float | None]] = {}
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        for endpoint in endpoints:
            if endpoint.name in self._transports:
                continue
            t = endpoint.timeouts
            self._transports[endpoint.name] = transport(endpoint)
            timeout = httpx.Timeout(t.total_s, connect=t.connect_s, read=t.idle_s, pool=t.connect_s)
            self._timeouts[endpoint.name] = timeout.as_dict()

    def _url(self, endpoint: Endpoint, path: str) -> httpx.URL:
        url = self._urls.get((endpoint.base_url, path))
        if url is None:  # one per (API root, OpenAI path): a handful (a DNS pool's: a handful per replica)
            if len(self._urls) > _MAX_URLS:
                self._urls.clear()
            url = self._urls[endpoint.base_url, path] = httpx.URL(endpoint.base_url.rstrip("/") + path)
        return url

    async def open(
        self,
        endpoint: Endpoint,
        path: str,
        body: bytes,
        client_headers: Sequence[tuple[bytes, bytes]],
        *,
        trace_context: Sequence[tuple[bytes, bytes]] = (),
        client_ip: str | None = None,
    ) -> httpx.Response:
        """Send a POST and return the response once its headers arrived (body not read).
        `trace_context` (W3C `traceparent`/`tracestate` of the attempt's span) replaces the
        client's own, so the upstream's spans hang under the attempt; `client_ip` becomes the
        only `X-Forwarded-For`.

        Raises UpstreamStatus for a non-2xx answer (its body read, the response closed),
        UpstreamMisconfigured for a 3xx/401/403/404/405/407, UpstreamTimeout when no headers
        came within the endpoint's `ttft_s`, UpstreamBadResponse for a malformed answer and
        UpstreamUnreachable for connection failures.
        """
        headers = upstream_headers(client_headers, endpoint, trace_context, client_ip)
        try:
            request = httpx.Request(
                "POST",
                self._url(endpoint, path),
                content=body,
                headers=headers,
                extensions={"timeout": self._timeouts[endpoint.name]},
            )
            async with asyncio.timeout(endpoint.timeouts.ttft_s):
                response = await self._transports[endpoint.name].handle_async_request(request)
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{endpoint.name}: no response within {endpoint.timeouts.ttft_s:g}s"
            ) from exc
        except _TRANSPORT_ERRORS as exc:
            raise translate(exc, endpoint) from exc
        response.request = request
        if not 200 <= response.status_code < 300:
            raise await _status_failure(response, endpoint)
        return response

    async def chunks(
        self, response: httpx.Response, endpoint: Endpoint, request_deadline: float
    ) -> AsyncIterator[bytes]:
        """The response body as it arrives; transport failures become UpstreamFailure. The
        idle gap is bounded by the read timeout; the whole stream ends by the endpoint's
        `total_s` (UpstreamTimeout) or the request's deadline (event-loop time;
        RequestTimeout), whichever comes first."""
        total_s = endpoint.timeouts.total_s
        ends = asyncio.get_running_loop().time() + total_s
        request_bound = request_deadline < ends
        raw = response.aiter_raw()
        try:
            while True:
                timer = asyncio.timeout_at(min(ends, request_deadline))
                try:
                    async with timer:
                        chunk = await anext(raw, None)
                except TimeoutError:
                    if not timer.expired():
                        raise  # the transport's own timeout: translated below
                    if request_bound:
                        raise RequestTimeout(REQUEST_TIMEOUT_MESSAGE) from None
                    raise UpstreamTimeout(f"{endpoint.name}: stream exceeded {total_s:g}s") from None
                if chunk is None:
                    return
                yield chunk
        except _TRANSPORT_ERRORS as exc:
            raise translate(exc, endpoint) from exc

    async def first_event(
        self, response: httpx.Response, chunks: AsyncIterator[bytes], endpoint: Endpoint, relay: SseRelay
    ) -> bytes:
        """The client bytes of the stream's first whole events, framed by `relay`, within the
        endpoint's `ttft_s`. Until then nothing is sent to the client, so an answer that is
        not an event stream, an empty stream, a stall or a first event over the relay's
        `max_event_bytes` is an upstream failure that can still fail over."""
        kind = response.headers.get("content-type", "")
        if not kind.lower().startswith("text/event-stream"):
            raise UpstreamBadResponse(
                f"{endpoint.name}: the upstream did not answer with an event stream",
                detail=f"{endpoint.name}: stream answered with content-type {kind[:80]!r}",
            )
        try:
            async with asyncio.timeout(endpoint.timeouts.ttft_s):
                first = await first_events(relay, chunks)
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{endpoint.name}: no first token within {endpoint.timeouts.ttft_s:g}s"
            ) from exc
        if not first:
            raise UpstreamUnreachable(f"{endpoint.name}: empty stream")
        return first

    async def read(self, response: httpx.Response, endpoint: Endpoint, max_bytes: int) -> bytes:
        """The whole body within the endpoint's `total_s` and `max_bytes` (else
        UpstreamBadResponse, read no further); the response is closed after."""
        body = bytearray()
        try:
            async with asyncio.timeout(endpoint.timeouts.total_s):
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > max_bytes:
                        raise UpstreamBadResponse(
                            f"{endpoint.name}: the upstream's answer is too large",
                            detail=f"{endpoint.name}: answer over limits.max_response_bytes ({max_bytes})",
                        )
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{endpoint.name}: no complete answer within {endpoint.timeouts.total_s:g}s"
            ) from exc
        except _TRANSPORT_ERRORS as exc:
            raise translate(exc, endpoint) from exc
        finally:
            await response.aclose()
        return bytes(body)

    async def aclose(self) -> None:
        await asyncio.gather(*(t.aclose() for t in self._transports.values()))


def response_headers(response: httpx.Response) -> dict[str, str]:
    """The upstream headers worth relaying to the client (never its cookies or server info);
    a repeated one joined with commas, as `httpx.Headers` reads it. One pass over the headers:
    a lookup by name scans them all, twice per name kept."""
    kept: dict[str, str] = {}
    for name, value in response.headers.multi_items():
        if name in _KEEP_RESPONSE_HEADERS:
            kept[name] = f"{kept[name]}, {value}" if name in kept else value
    return kept


def translate(exc: BaseException, endpoint: Endpoint) -> UpstreamFailure:
    """Any transport exception as the gateway's own. httpx-aiohttp maps most aiohttp
    connection errors to httpx.ConnectTimeout, so the aiohttp cause, when there is one,
    decides: only a real timeout is a timeout. The client reads only the endpoint's name and
    the kind of failure; the library's text (hosts, ports) goes to the log as `detail`."""
    cause = exc.__cause__ if isinstance(exc, httpx.HTTPError) and exc.__cause__ is not None else exc
    text = f"{endpoint.name}: {type(cause).__name__}: {cause}"
    if isinstance(cause, TimeoutError | httpx.TimeoutException):
        return UpstreamTimeout(f"{endpoint.name}: the upstream timed out", detail=text)
    if isinstance(cause, aiohttp.ClientPayloadError):  # "Response payload is not completed"
        message = f"{endpoint.name}: the upstream closed before its answer ended"
        return UpstreamUnreachable(message, detail=text)
    if isinstance(cause, aiohttp.ClientResponseError | httpx.DecodingError):
        return UpstreamBadResponse(f"{endpoint.name}: the upstream sent a malformed answer", detail=text)
    return UpstreamUnreachable(f"{endpoint.name}: the upstream is unreachable", detail=text)


def upstream_headers(
    client_headers: Sequence[tuple[bytes, bytes]],
    endpoint: Endpoint,
    trace_context: Sequence[tuple[bytes, bytes]] = (),
    client_ip: str | None = None,
) -> list[tuple[bytes, bytes]]:
    """The client's headers less hop-by-hop ones (fixed, and those its `Connection` names),
    its secrets, forwarding claims and billing scope; plus ours."""
    not_forwarded = {k for k, _ in trace_context}
    not_forwarded.update(
        n.strip().lower() for k, v in client_headers if k == b"connection" for n in v.split(b",")
    )
    headers = [
        (k, v)
        for k, v in client_headers
        if k not in _DROP_REQUEST_HEADERS
        and not _names_a_credential(k)
        and k not in not_forwarded
        and not k.startswith((b"x-tidegate-", b"x-forwarded-"))
    ]
    headers.extend(trace_context)
    headers.append((b"accept-encoding", b"identity"))
    if client_ip:
        headers.append((b"x-forwarded-for", client_ip.encode("latin-1")))
    if endpoint.api_key:
        headers.append((b"authorization", b"Bearer " + endpoint.api_key.encode()))
    if endpoint.organization:
        headers.append((b"openai-organization", endpoint.organization.encode()))
    if endpoint.project:
        headers.append((b"openai-project", endpoint.project.encode()))
    return headers


async def _status_failure(response: httpx.Response, endpoint: Endpoint) -> UpstreamFailure:
    payload = b""
    try:
        async for chunk in response.aiter_raw():
            payload += chunk
            if len(payload) > _MAX_ERROR_BODY:
                break
    except _TRANSPORT_ERRORS:
        pass  # the status alone is enough to report this failure
    finally:
        await response.aclose()
    status = response.status_code
    if status < 400 or status in _MISCONFIGURED:
        log.error(  # never the body: an upstream may echo the key it refused
            "upstream %s answered %d%s: check its base_url, model and api_key",
            endpoint.name,
            status,
            _error_kind(payload),
        )
        return UpstreamMisconfigured(
            f"route {endpoint.name} is misconfigured at the gateway; its operator has been told",
            detail=f"{endpoint.name}: upstream answered {status}",
        )
    return UpstreamStatus(status, payload[:_MAX_ERROR_BODY], _retry_after(response.headers))


def _error_kind(payload: bytes) -> str:
    """The `type` and `code` of an OpenAI-shaped error body (short, never its message)."""
    try:
        found = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return ""
    error = found.get("error") if isinstance(found, dict) else None
    if not isinstance(error, dict):
        return ""
    parts = [f"{k}={str(error[k])[:40]!r}" for k in ("type", "code") if isinstance(error.get(k), str)]
    return f" ({', '.join(parts)})" if parts else ""


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date: rare from LLM APIs, fall back to our own backoff
