"""Pooled HTTP calls to upstream endpoints; the only place httpx/aiohttp errors are seen.

One `httpx.AsyncClient` per endpoint, keep-alive pooled. The transport is a seam
(`TransportFactory`): the default is `httpx-aiohttp`, whose CPU cost per request is a
fraction of httpx's own transport (DESIGN.md, performance facts); tests may pass any
`httpx.AsyncBaseTransport`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from router.config import Endpoint
from router.errors import UpstreamFailure, UpstreamStatus, UpstreamTimeout, UpstreamUnreachable

TransportFactory = Callable[[Endpoint], httpx.AsyncBaseTransport]

# Never forwarded upstream: hop-by-hop (RFC 9110 §7.6.1), recomputed, or the client's secrets.
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
    }
)
_KEEP_RESPONSE_HEADERS = ("content-type", "x-request-id", "openai-processing-ms")
_MAX_ERROR_BODY = 64 * 1024
_POOL_CONNECTIONS = 1024


def aiohttp_transport(endpoint: Endpoint) -> httpx.AsyncBaseTransport:
    """The default transport: aiohttp under httpx's API, one connection pool per endpoint."""
    limits = httpx.Limits(max_connections=_POOL_CONNECTIONS, keepalive_expiry=60.0)
    transport: httpx.AsyncBaseTransport = AiohttpTransport(limits=limits, trust_env=False)
    return transport


class Upstream:
    """Opens requests to endpoints and maps every transport failure to `UpstreamFailure`."""

    def __init__(self, endpoints: Iterable[Endpoint], transport: TransportFactory) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}
        for endpoint in endpoints:
            if endpoint.name in self._clients:
                continue
            t = endpoint.timeouts
            self._clients[endpoint.name] = httpx.AsyncClient(
                transport=transport(endpoint),
                timeout=httpx.Timeout(t.total_s, connect=t.connect_s, read=t.idle_s, pool=t.connect_s),
            )

    async def open(
        self,
        endpoint: Endpoint,
        path: str,
        body: bytes,
        client_headers: Iterable[tuple[bytes, bytes]],
        trace_context: Sequence[tuple[bytes, bytes]] = (),
    ) -> httpx.Response:
        """Send a POST and return the response once its headers arrived (body not read).
        `trace_context` (W3C `traceparent`/`tracestate` of the attempt's span) replaces the
        client's own, so the upstream's spans hang under the attempt.

        Raises UpstreamStatus for a non-2xx answer (its body read, the response closed),
        UpstreamTimeout when no headers came within the endpoint's `ttft_s`, and
        UpstreamUnreachable for connection failures.
        """
        client = self._clients[endpoint.name]
        request = client.build_request(
            "POST",
            endpoint.base_url.rstrip("/") + path,
            content=body,
            headers=_upstream_headers(client_headers, endpoint.api_key, trace_context),
        )
        try:
            async with asyncio.timeout(endpoint.timeouts.ttft_s):
                response = await client.send(request, stream=True)
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{endpoint.name}: no response within {endpoint.timeouts.ttft_s:g}s"
            ) from exc
        except httpx.HTTPError as exc:
            raise translate(exc, endpoint) from exc
        if response.status_code >= 400:
            raise await _status_failure(response, endpoint)
        return response

    async def chunks(self, response: httpx.Response, endpoint: Endpoint) -> AsyncIterator[bytes]:
        """The response body as it arrives; transport failures become UpstreamFailure. The
        idle gap is bounded by the read timeout, the whole stream by `total_s`."""
        deadline = time.monotonic() + endpoint.timeouts.total_s
        try:
            async for chunk in response.aiter_raw():
                yield chunk
                if time.monotonic() > deadline:
                    raise UpstreamTimeout(f"{endpoint.name}: stream exceeded {endpoint.timeouts.total_s:g}s")
        except httpx.HTTPError as exc:
            raise translate(exc, endpoint) from exc

    async def first_chunk(self, chunks: AsyncIterator[bytes], endpoint: Endpoint) -> bytes:
        """The first body chunk, within the endpoint's `ttft_s` (streams only)."""
        try:
            async with asyncio.timeout(endpoint.timeouts.ttft_s):
                return await anext(chunks)
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{endpoint.name}: no first token within {endpoint.timeouts.ttft_s:g}s"
            ) from exc
        except StopAsyncIteration as exc:
            raise UpstreamUnreachable(f"{endpoint.name}: empty stream") from exc

    async def read(self, response: httpx.Response, endpoint: Endpoint) -> bytes:
        """The whole body within the endpoint's `total_s`; the response is closed after."""
        try:
            async with asyncio.timeout(endpoint.timeouts.total_s):
                return await response.aread()
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{endpoint.name}: no complete answer within {endpoint.timeouts.total_s:g}s"
            ) from exc
        except httpx.HTTPError as exc:
            raise translate(exc, endpoint) from exc
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._clients.values()))


def response_headers(response: httpx.Response) -> dict[str, str]:
    """The upstream headers worth relaying to the client (never its cookies or server info)."""
    return {k: response.headers[k] for k in _KEEP_RESPONSE_HEADERS if k in response.headers}


def translate(exc: httpx.HTTPError, endpoint: Endpoint) -> UpstreamFailure:
    """httpx-aiohttp maps most aiohttp connection errors to httpx.ConnectTimeout, so the
    aiohttp cause, when there is one, decides: only a real timeout is a timeout."""
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ClientError | TimeoutError):
        timed_out = isinstance(cause, TimeoutError)
    else:
        timed_out = isinstance(exc, httpx.TimeoutException)
    detail = str(cause or exc) or type(cause or exc).__name__
    if timed_out:
        return UpstreamTimeout(f"{endpoint.name}: timed out ({detail})")
    return UpstreamUnreachable(f"{endpoint.name}: unreachable ({detail})")


def _upstream_headers(
    client_headers: Iterable[tuple[bytes, bytes]],
    api_key: str,
    trace_context: Sequence[tuple[bytes, bytes]] = (),
) -> list[tuple[bytes, bytes]]:
    replaced = {k for k, _ in trace_context}
    headers = [
        (k, v)
        for k, v in client_headers
        if k not in _DROP_REQUEST_HEADERS and not k.startswith(b"x-tidegate-") and k not in replaced
    ]
    headers.extend(trace_context)
    headers.append((b"accept-encoding", b"identity"))
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode()))
    return headers


async def _status_failure(response: httpx.Response, endpoint: Endpoint) -> UpstreamFailure:
    payload = b""
    try:
        async for chunk in response.aiter_raw():
            payload += chunk
            if len(payload) > _MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass  # the status alone is enough to report this failure
    finally:
        await response.aclose()
    return UpstreamStatus(response.status_code, payload[:_MAX_ERROR_BODY], _retry_after(response.headers))


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date: rare from LLM APIs, fall back to our own backoff
