"""What the gateway writes down about a finished request: the route's shared histograms and
counters in the store (buffered, no I/O), the access-log outcome (and through the recorder's
sinks, the Prometheus metrics), and the end of its spans."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from opentelemetry.trace import Span, StatusCode

from policies.canary import bucket
from policies.types import route_key
from router.config import DedicatedEndpoint, Endpoint
from router.job import Job, ms_since
from router.records import Measures, Outcome, Recorder, RequestRecord
from router.relay import StreamResult, Usage, usage_of_body
from router.state.latency import Metric
from router.telemetry import (
    ERROR_TYPE,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_RESPONSE_MODEL,
    KIND,
    OUTCOME,
    REASON,
    ROUTE,
)


class Samples(Protocol):
    """The state store as the books use it: no I/O, merged into the shared windows later."""

    def observe(self, route: str, metric: Metric, value_ms: float) -> None: ...

    def count(self, route: str, counts: Mapping[str, float]) -> None: ...


class Books:
    def __init__(self, store: Samples, recorder: Recorder, *, recording: bool = True) -> None:
        """`recording=False` keeps the log, metrics and spans but not the store's per-route
        histograms and counters (`state.record`)."""
        self._store = store
        self._recorder = recorder
        self._recording = recording

    def observe(self, route: str, metric: Metric, value_ms: float) -> None:
        if self._recording:
            self._store.observe(route, metric, value_ms)

    def body_done(self, job: Job, target: Endpoint, status: int, body: bytes) -> None:
        """A served body answer (error answers are recorded by the dispatcher's failure path)."""
        usage = usage_of_body(body) or Usage()
        self.observe(
            route_key(job.facts.request.model, target.name), Metric.E2E, ms_since(job.attempt_started)
        )
        measures = Measures(None, usage.input_tokens, usage.output_tokens, queue_ms=job.queue_ms)
        self.record(job, target, status, measures, job.walk.served_outcome())

    def stream_done(self, job: Job, target: Endpoint, status: int, result: StreamResult) -> None:
        usage = result.usage or Usage()
        error = None
        if result.error is not None:
            error = type(result.error).__name__
        elif result.cut is not None:
            error = result.cut
        elif not result.completed:
            error = "client_gone"
        ttft = (result.first_token_at - job.facts.received_at) * 1000 if result.first_token_at else None
        itl = self._observe_stream(job, target, result, served=error is None)
        estimated = usage.output_tokens is None
        output = result.output_events if estimated else usage.output_tokens
        rate = None
        if itl and output and result.output_events > 1:  # tokens over the span of the output events
            rate = round(output / (itl * (result.output_events - 1) / 1000.0), 2)
        measures = Measures(ttft, usage.input_tokens, output, error, estimated, job.queue_ms, itl, rate)
        if result.error is not None:
            outcome = Outcome.FAILED_MID_STREAM
        elif error is not None:
            outcome = Outcome.CLIENT_GONE
        else:
            outcome = job.walk.served_outcome()
        self.record(job, target, status, measures, outcome)

    def _observe_stream(
        self, job: Job, target: Endpoint, result: StreamResult, *, served: bool
    ) -> float | None:
        """The route's own latency: from this attempt's request, not from the client's (a
        failover's earlier attempts and the wait in line are not the route's doing).
        Returns the stream's mean inter-token latency (ms) when it had 2+ output events."""
        route = route_key(job.facts.request.model, target.name)
        itl = None
        if result.first_token_at:
            self.observe(route, Metric.TTFT, (result.first_token_at - job.attempt_started) * 1000)
            if result.output_events > 1:
                itl = (time.monotonic() - result.first_token_at) * 1000 / (result.output_events - 1)
                self.observe(route, Metric.ITL, itl)
        if served:
            self.observe(route, Metric.E2E, ms_since(job.attempt_started))
        return itl

    def record(
        self, job: Job, target: Endpoint | None, status: int, measures: Measures, outcome: Outcome
    ) -> None:
        if self._recording:
            self._count(job, target, status, measures, outcome)
        if job.span is not None:
            _end_spans(job, target, status, measures, outcome)
        self._recorder.record(
            RequestRecord(
                model=job.facts.request.model,
                route=target.name if target else None,
                kind=target.kind if target else None,
                reason=job.walk.reason,
                status=status,
                stream=job.facts.request.stream,
                e2e_ms=ms_since(job.facts.received_at),
                measures=measures,
                outcome=outcome,
                attempts=tuple(job.walk.attempts),
                retry_budget_denied=job.budget_denied,
                stickiness_bucket=bucket(job.facts.request.model, job.facts.stickiness_key),
                overhead_ms=job.overhead_ms,
            )
        )

    def _count(
        self, job: Job, target: Endpoint | None, status: int, measures: Measures, outcome: Outcome
    ) -> None:
        """The request in its final route's shared counters (`-` when no route was tried)."""
        counts: dict[str, float] = {
            "requests": 1,
            f"outcome:{outcome.value}": 1,
            f"reason:{job.walk.reason.value}": 1,
        }
        if status >= 400 or measures.error is not None:
            counts["errors"] = 1
        if len(job.walk.attempts) > 1:
            counts["retries"] = len(job.walk.attempts) - 1
        if measures.input_tokens:
            counts["tokens_in"] = measures.input_tokens
        if measures.output_tokens:
            counts["tokens_out"] = measures.output_tokens
        if isinstance(target, DedicatedEndpoint) and job.attempt_started:
            counts["busy_ms"] = ms_since(job.attempt_started)  # slot held: admission -> now
        self._store.count(route_key(job.facts.request.model, target.name if target else "-"), counts)


def _end_spans(job: Job, target: Endpoint | None, status: int, measures: Measures, outcome: Outcome) -> None:
    error = measures.error if (measures.error or status >= 400) else None
    if job.attempt_span is not None and job.attempt_span.is_recording():
        end_span(job.attempt_span, error)
    span = job.span
    assert span is not None
    span.set_attribute(REASON, job.walk.reason.value)
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
    end_span(span, error)


def end_span(span: Span | None, error: str | None) -> None:
    if span is None:
        return
    if error is not None:
        span.set_attribute(ERROR_TYPE, error)
        span.set_status(StatusCode.ERROR, error)
    span.end()
