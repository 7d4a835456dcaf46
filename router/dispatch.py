"""One request's life: snapshot -> policy -> admission -> attempts -> relay -> record.

All I/O of a request is started here. Attempts are driven by tenacity: an attempt that fails
before the first byte reached the client moves on to the next target of the decision
(dedicated -> serverless -> next serverless), without waiting when the next target is a
different endpoint, with backoff (or the upstream's Retry-After) when it is the same one.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import httpx
from opentelemetry.trace import Span, StatusCode
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt

from policies.base import Decision, Policy, Reason, RequestContext
from policies.canary import bucket
from router.breaker import Breakers
from router.budget import RetryBudget
from router.config import BreakerConfig, DedicatedEndpoint, Endpoint, GatewayConfig, ModelConfig
from router.errors import GatewayError, ModelNotFound, NoCapacity, UpstreamFailure, UpstreamStatus
from router.latency import Metric, route_key
from router.openai import RequestPeek, peek, upstream_body
from router.records import Attempt, Measures, Outcome, Recorder, RetryOutcome
from router.relay import StreamResult, Usage, relay_stream, usage_of_body
from router.signals import Signals
from router.state.base import Lease, Snapshot, StateStore
from router.telemetry import (
    ERROR_TYPE,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_RESPONSE_MODEL,
    KIND,
    OUTCOME,
    REASON,
    ROUTE,
    Telemetry,
    trace_headers,
)
from router.upstream import Upstream, response_headers

# Paths whose streams end with `data: [DONE]` and accept `stream_options.include_usage`.
_DONE_TERMINATED = frozenset({"/chat/completions", "/completions"})
_MAX_RETRY_AFTER_S = 30.0


@dataclass(slots=True)
class Reply:
    """A finished answer for the HTTP layer: a body, or a stream plus its cleanup."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    on_close: Callable[[], Awaitable[None]] | None = None


@dataclass(slots=True)
class _Job:
    """The mutable record of one request while it is dispatched."""

    path: str
    request: RequestPeek
    config: ModelConfig
    headers: Sequence[tuple[bytes, bytes]]
    received_at: float
    decision: Decision
    reason: Reason
    snapshot: Snapshot
    cursor: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    last_target: Endpoint | None = None
    stickiness_key: str = ""
    span: Span | None = None  # the request's span (None: tracing off)
    attempt_span: Span | None = None
    overhead_ms: float | None = None
    backoff_ms: float = 0.0  # slept between attempts (not the gateway's overhead)
    budget_denied: bool = False
    attempt_started: float = 0.0  # monotonic; the current attempt's request was sent after it
    queue_ms: float = 0.0  # time spent waiting in line for a dedicated slot


class Dispatcher:
    def __init__(
        self,
        config: GatewayConfig,
        store: StateStore,
        upstream: Upstream,
        recorder: Recorder,
        policies: Mapping[str, Policy],
        *,
        signals: Signals | None = None,
        breakers: Breakers | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._signals = signals or Signals(config, store)
        self._breakers = breakers or Breakers(store, breaker_configs(config))
        self._budgets = {name: RetryBudget(model.retry) for name, model in config.models.items()}
        self._telemetry = telemetry or Telemetry()
        self._recording = config.state.record
        self._upstream = upstream
        self._recorder = recorder
        self._policies = policies

    async def dispatch(
        self, path: str, body: bytes, headers: Sequence[tuple[bytes, bytes]], received_at: float
    ) -> Reply:
        """Serve one OpenAI request body for `path` (relative to /v1). Raises ClientError
        for a request the gateway itself rejects; every other outcome is a Reply."""
        request = peek(body, self._config.limits.max_output_tokens)
        config = self._config.models.get(request.model)
        if config is None:
            raise ModelNotFound(f"The model `{request.model}` does not exist", param="model")
        key = _stickiness(request, headers)
        context = RequestContext(request.model, config, request.stream, key)
        snapshot = self._signals.snapshot()
        decision = self._policies[request.model].decide(context, snapshot, config.endpoints)
        job = _Job(
            path,
            request,
            config,
            headers,
            received_at,
            decision,
            decision.reason,
            snapshot,
            stickiness_key=key,
        )
        job.span = self._telemetry.start_request(path, request.model, headers)
        self._budgets[request.model].request()
        try:
            return await self._attempts(job)
        except UpstreamFailure as exc:
            return self._failed(job, exc)
        except asyncio.CancelledError:  # the client left (or the server stops) before an answer
            self._record(job, job.last_target, 499, Measures(error="client_gone"), RetryOutcome.CLIENT_GONE)
            raise

    async def _attempts(self, job: _Job) -> Reply:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(job.config.retry.attempts),
            wait=lambda state: self._wait(job, state),
            retry=lambda state: self._should_retry(job, state),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(job)
        raise AssertionError("tenacity ended without an outcome")  # pragma: no cover

    def _should_retry(self, job: _Job, state: RetryCallState) -> bool:
        """Retry a retryable failure while attempts remain. Failing over to another endpoint
        is always allowed; trying the same endpoint again spends the model's retry budget
        (that is what multiplies load on a struggling upstream). A refusal is recorded."""
        exc = state.outcome.exception() if state.outcome else None
        if exc is None or not _retryable(exc) or state.attempt_number >= job.config.retry.attempts:
            return False
        if self._fails_over(job, exc) or self._budgets[job.request.model].try_retry():
            return True
        job.budget_denied = True
        return False

    async def _attempt(self, job: _Job) -> Reply:
        target, lease = await self._admit(job)
        started = job.attempt_started = time.monotonic()
        body = upstream_body(job.request, target.model, ask_usage=job.path in _DONE_TERMINATED)
        job.attempt_span = self._telemetry.start_attempt(job.span, len(job.attempts) + 1, target)
        context = trace_headers(job.attempt_span)
        response: httpx.Response | None = None
        try:
            response = await self._upstream.open(target, job.path, body, job.headers, context)
            if job.request.stream:
                reply = await self._stream_reply(job, target, response, lease)
            else:
                reply = await self._body_reply(job, target, response)
        except UpstreamFailure as exc:
            job.attempts.append(Attempt(target.name, type(exc).__name__, _ms(started)))
            _end_span(job.attempt_span, type(exc).__name__)
            if exc.blames_endpoint:
                self._breakers.record(route_key(job.request.model, target.name), False, job.snapshot)
            await self._release(lease)
            job.cursor += 1
            raise
        except asyncio.CancelledError:  # cancelled mid-attempt: close and release, shielded
            job.attempts.append(Attempt(target.name, "Cancelled", _ms(started)))
            with anyio.CancelScope(shield=True):
                if response is not None:
                    await response.aclose()
                await self._release(lease)
            raise
        job.attempts.append(Attempt(target.name, None, _ms(started)))
        if reply.status < 400:
            self._breakers.record(route_key(job.request.model, target.name), True, job.snapshot)
        reply.headers["x-tidegate-attempts"] = str(len(job.attempts))
        reply.headers["x-tidegate-outcome"] = _served(job, target).value
        job.overhead_ms = _overhead_ms(job)
        reply.headers["x-tidegate-overhead-ms"] = f"{job.overhead_ms:.3f}"
        if reply.stream is None:
            reply.on_close = lambda: self._close_body(job, target, reply, lease)
        return reply

    async def _close_body(self, job: _Job, target: Endpoint, reply: Reply, lease: Lease | None) -> None:
        """After a body reply was sent (or failed to send): release the slot, record."""
        await self._release(lease)
        self._record_body(job, target, reply)

    async def _admit(self, job: _Job) -> tuple[Endpoint, Lease | None]:
        """The next target that admits the request, walking the decision from the cursor;
        a full dedicated pool is skipped (`saturated`)."""
        targets = job.decision.targets
        for step in range(len(targets)):
            target = targets[(job.cursor + step) % len(targets)]
            if not isinstance(target, DedicatedEndpoint):
                self._note_target(job, target, step)
                return target, None
            lease = await self._acquire(job, target, first=step == 0 and not job.attempts)
            if lease is not None:
                self._signals.dispatched(target.name)
                self._note_target(job, target, step)
                return target, lease
            job.reason = Reason.SATURATED
        raise NoCapacity(f"every dedicated endpoint of {job.request.model} is at capacity")

    async def _acquire(self, job: _Job, target: DedicatedEndpoint, *, first: bool) -> Lease | None:
        """A slot on `target`; the first try may wait in line as long as the policy allowed."""
        wait_s = job.decision.queue_ms / 1000.0 if first else 0.0
        if wait_s <= 0:
            return await self._store.try_acquire(target.name, target.max_concurrency)
        started = time.monotonic()
        lease = await self._store.try_acquire(target.name, target.max_concurrency, wait_s)
        job.queue_ms = _ms(started)
        self._observe(route_key(job.request.model, target.name), Metric.QUEUE, job.queue_ms)
        return lease

    def _note_target(self, job: _Job, target: Endpoint, skipped: int) -> None:
        job.cursor += skipped
        if job.attempts and job.attempts[-1].error is not None and target != job.last_target:
            job.reason = Reason.FAILOVER
        job.last_target = target

    async def _body_reply(self, job: _Job, target: Endpoint, response: httpx.Response) -> Reply:
        payload = await self._upstream.read(response, target)
        return Reply(response.status_code, self._headers(job, target, response), payload)

    async def _stream_reply(
        self, job: _Job, target: Endpoint, response: httpx.Response, lease: Lease | None
    ) -> Reply:
        """Wait for the upstream's first event before answering the client: until then a
        stall or a failure can still be retried elsewhere."""
        chunks = self._upstream.chunks(response, target)
        try:
            first = await self._upstream.first_chunk(chunks, target)
        except UpstreamFailure:
            await response.aclose()
            raise
        result = StreamResult()
        relayed = relay_stream(
            _prepend(first, chunks),
            result,
            drop_usage=job.path in _DONE_TERMINATED and not job.request.wants_usage,
            expect_done=job.path in _DONE_TERMINATED,
        )

        async def close() -> None:
            await response.aclose()
            await self._release(lease)
            self._record_stream(job, target, response.status_code, result)

        return Reply(
            response.status_code, self._headers(job, target, response), stream=relayed, on_close=close
        )

    def _record_body(self, job: _Job, target: Endpoint, reply: Reply) -> None:
        usage = usage_of_body(reply.body) or Usage()
        if reply.status < 400:
            self._observe(route_key(job.request.model, target.name), Metric.E2E, _ms(job.attempt_started))
        measures = Measures(None, usage.input_tokens, usage.output_tokens, queue_ms=job.queue_ms)
        self._record(job, target, reply.status, measures, _served(job, target))

    def _record_stream(self, job: _Job, target: Endpoint, status: int, result: StreamResult) -> None:
        usage = result.usage or Usage()
        error = None
        if result.error is not None:
            error = type(result.error).__name__
        elif not result.completed:
            error = "client_gone"
        ttft = (result.first_token_at - job.received_at) * 1000 if result.first_token_at else None
        itl = self._observe_stream(job, target, result, served=error is None)
        if result.error is not None:  # the upstream failed mid-stream
            self._breakers.record(route_key(job.request.model, target.name), False, job.snapshot)
        estimated = usage.output_tokens is None
        output = result.output_events if estimated else usage.output_tokens
        rate = None
        if itl and output and result.output_events > 1:  # tokens over the span of the output events
            rate = round(output / (itl * (result.output_events - 1) / 1000.0), 2)
        measures = Measures(ttft, usage.input_tokens, output, error, estimated, job.queue_ms, itl, rate)
        if result.error is not None:
            outcome = RetryOutcome.FAILED_MID_STREAM
        elif error is not None:
            outcome = RetryOutcome.CLIENT_GONE
        else:
            outcome = _served(job, target)
        self._record(job, target, status, measures, outcome)

    def _observe_stream(
        self, job: _Job, target: Endpoint, result: StreamResult, *, served: bool
    ) -> float | None:
        """The route's own latency: from this attempt's request, not from the client's (a
        failover's earlier attempts and the wait in line are not the route's doing).
        Returns the stream's mean inter-token latency (ms) when it had 2+ output events."""
        route = route_key(job.request.model, target.name)
        itl = None
        if result.first_token_at:
            self._observe(route, Metric.TTFT, (result.first_token_at - job.attempt_started) * 1000)
            if result.output_events > 1:
                itl = (time.monotonic() - result.first_token_at) * 1000 / (result.output_events - 1)
                self._observe(route, Metric.ITL, itl)
        if served:
            self._observe(route, Metric.E2E, _ms(job.attempt_started))
        return itl

    def _failed(self, job: _Job, exc: UpstreamFailure) -> Reply:
        target = job.last_target
        headers = self._headers(job, target, None)
        headers["x-tidegate-attempts"] = str(len(job.attempts))
        if exc.retry_after_s is not None:
            headers["retry-after"] = f"{exc.retry_after_s:g}"
        elif isinstance(exc, NoCapacity):
            headers["retry-after"] = "1"
        headers["content-type"] = "application/json"
        rejected = isinstance(exc, UpstreamStatus) and not exc.is_retryable
        outcome = RetryOutcome.CLIENT_ERROR if rejected else RetryOutcome.EXHAUSTED
        headers["x-tidegate-outcome"] = outcome.value
        self._record(job, target, exc.status_code, Measures(error=type(exc).__name__), outcome)
        return Reply(exc.status_code, headers, exc.body())

    def _headers(self, job: _Job, target: Endpoint | None, response: httpx.Response | None) -> dict[str, str]:
        headers = response_headers(response) if response is not None else {}
        if target is not None:
            headers["x-tidegate-route"] = target.name
            headers["x-tidegate-kind"] = target.kind.value
        headers["x-tidegate-reason"] = job.reason.value
        return headers

    def _record(
        self, job: _Job, target: Endpoint | None, status: int, measures: Measures, outcome: RetryOutcome
    ) -> None:
        self._count(job, target, status, measures, outcome)
        if job.span is not None:
            self._end_spans(job, target, status, measures, outcome)
        self._recorder.record(
            Outcome(
                model=job.request.model,
                route=target.name if target else None,
                kind=target.kind if target else None,
                reason=job.reason,
                status=status,
                stream=job.request.stream,
                e2e_ms=_ms(job.received_at),
                measures=measures,
                outcome=outcome,
                attempts=tuple(job.attempts),
                retry_budget_denied=job.budget_denied,
                stickiness_bucket=bucket(job.request.model, job.stickiness_key),
                overhead_ms=job.overhead_ms,
            )
        )

    def _end_spans(
        self, job: _Job, target: Endpoint | None, status: int, measures: Measures, outcome: RetryOutcome
    ) -> None:
        error = measures.error if (measures.error or status >= 400) else None
        if job.attempt_span is not None and job.attempt_span.is_recording():
            _end_span(job.attempt_span, error)
        span = job.span
        assert span is not None
        span.set_attribute(REASON, job.reason.value)
        span.set_attribute(OUTCOME, outcome.value)
        span.set_attribute("http.response.status_code", status)
        if target is not None:
            span.set_attribute(ROUTE, target.name)
            span.set_attribute(KIND, target.kind.value)
            span.set_attribute(GEN_AI_RESPONSE_MODEL, target.model)
        if measures.input_tokens is not None:
            span.set_attribute(GEN_AI_INPUT_TOKENS, measures.input_tokens)
        if measures.output_tokens is not None:
            span.set_attribute(GEN_AI_OUTPUT_TOKENS, measures.output_tokens)
        _end_span(span, error)

    def _count(
        self, job: _Job, target: Endpoint | None, status: int, measures: Measures, outcome: RetryOutcome
    ) -> None:
        """The request in its final route's shared counters (`-` when no route was tried)."""
        counts: dict[str, float] = {
            "requests": 1,
            f"outcome:{outcome.value}": 1,
            f"reason:{job.reason.value}": 1,
        }
        if status >= 400 or measures.error is not None:
            counts["errors"] = 1
        if len(job.attempts) > 1:
            counts["retries"] = len(job.attempts) - 1
        if measures.input_tokens:
            counts["tokens_in"] = measures.input_tokens
        if measures.output_tokens:
            counts["tokens_out"] = measures.output_tokens
        if isinstance(target, DedicatedEndpoint) and job.attempt_started:
            counts["busy_ms"] = _ms(job.attempt_started)  # slot held: admission -> now
        if self._recording:
            self._store.count(route_key(job.request.model, target.name if target else "-"), counts)

    def _observe(self, route: str, metric: Metric, value_ms: float) -> None:
        if self._recording:
            self._store.observe(route, metric, value_ms)

    async def _release(self, lease: Lease | None) -> None:
        if lease is not None:
            self._signals.completed(lease.pool)
            await self._store.release(lease)

    @staticmethod
    def _fails_over(job: _Job, exc: BaseException | None) -> bool:
        """Whether the next attempt goes to a different endpoint than the last one."""
        targets = job.decision.targets
        return targets[job.cursor % len(targets)] != job.last_target and not isinstance(exc, NoCapacity)

    def _wait(self, job: _Job, state: RetryCallState) -> float:
        """No wait before a different endpoint; backoff or Retry-After before the same one."""
        exc = state.outcome.exception() if state.outcome else None
        if self._fails_over(job, exc):
            return 0.0
        if isinstance(exc, GatewayError) and exc.retry_after_s is not None:
            wait = min(exc.retry_after_s, _MAX_RETRY_AFTER_S)
        else:
            base = job.config.retry.backoff_ms / 1000.0 * 2.0 ** (state.attempt_number - 1)
            wait = base * random.uniform(0.5, 1.0)
        job.backoff_ms += wait * 1000
        return wait


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, UpstreamStatus):
        return exc.is_retryable
    return isinstance(exc, UpstreamFailure)


def _end_span(span: Span | None, error: str | None) -> None:
    if span is None:
        return
    if error is not None:
        span.set_attribute(ERROR_TYPE, error)
        span.set_status(StatusCode.ERROR, error)
    span.end()


def _overhead_ms(job: _Job) -> float:
    """Time the gateway itself spent before the answer started: since the request arrived,
    minus the wait in line, backoff sleeps and the time each upstream attempt took (the
    current one up to its headers or first event)."""
    upstream = sum(a.duration_ms for a in job.attempts)
    return max(0.0, _ms(job.received_at) - job.queue_ms - job.backoff_ms - upstream)


def _served(job: _Job, target: Endpoint) -> RetryOutcome:
    """How a served request's attempts went: first try, a retry at the same endpoint, or a
    failover to another one."""
    if len(job.attempts) <= 1:
        return RetryOutcome.FIRST_TRY
    if job.attempts[0].endpoint == target.name:
        return RetryOutcome.RETRIED_OK
    return RetryOutcome.FAILED_OVER_OK


def breaker_configs(config: GatewayConfig) -> dict[str, BreakerConfig]:
    """Each route's breaker config: its model's."""
    return {route_key(name, e.name): m.breaker for name, m in config.models.items() for e in m.endpoints}


def _stickiness(request: RequestPeek, headers: Sequence[tuple[bytes, bytes]]) -> str:
    """The request's `user`, else its `x-tidegate-session` header, else a random key."""
    if request.user:
        return request.user
    for key, value in headers:
        if key == b"x-tidegate-session":
            return value.decode("latin-1")
    return f"{random.getrandbits(64):016x}"  # a spread, not a secret: no syscall per request


def _ms(since: float) -> float:
    return (time.monotonic() - since) * 1000.0
